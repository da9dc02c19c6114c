"""Latency `slotlab proxy` adds on loopback (goal: p50 <= 1 ms, p99 <= 5 ms).

Three processes, so that no two share a GIL: a minimal upstream (asyncio, answers every request at once
with a fixed llama-server-like JSON, or with a 16-event SSE stream), `slotlab proxy --upstream ...
--record FILE` in front of it (recording, the worst case: every request is a /completion), and this
client, which sends the same request straight to the upstream and through the proxy, alternating
(ABBA) on two kept-alive raw sockets, and times each exchange to its last byte.

Added latency = a percentile of the proxied times minus the same percentile of the direct ones; the
per-pair differences (proxied minus the direct exchange next to it) are reported too.

    python -m bench.proxy_latency [--pairs 3000] [--stream] [--json OUT]"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps({"index": 0, "content": " Paris.", "tokens": [], "id_slot": 0, "stop": True, "model": "m",
                   "tokens_predicted": 2, "tokens_evaluated": 12, "tokens_cached": 13,
                   "timings": {"cache_n": 10, "prompt_n": 2, "prompt_ms": 1.0, "predicted_n": 2,
                               "predicted_ms": 1.0}}).encode()
SSE = b"".join(b"data: " + json.dumps({"content": f"t{i}", "stop": False}).encode() + b"\n\n" for i in range(15)) \
    + b"data: " + BODY + b"\n\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------- the upstream

async def _upstream_conn(reader, writer) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
            body = await reader.readexactly(n) if n else b""
            if b'"stream": true' in body:
                chunks = [f"{len(e) + 2:x}\r\n".encode() + e + b"\n\n\r\n" for e in SSE.split(b"\n\n") if e]
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"".join(chunks) + b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: "
                             + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve_upstream(port: int) -> None:
    async def main():
        srv = await asyncio.start_server(_upstream_conn, "127.0.0.1", port)
        print("ready", flush=True)
        async with srv:
            await srv.serve_forever()

    asyncio.run(main())


# ------------------------------------------------------------------------------------------- the client

class RawClient:
    """One kept-alive connection; `exchange()` sends a request and reads its whole answer."""

    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _fill(self) -> None:
        data = self.s.recv(1 << 16)
        if not data:
            raise ConnectionError("closed")
        self.buf += data

    def exchange(self, request: bytes) -> float:
        t0 = time.perf_counter()
        self.s.sendall(request)
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        low = head.lower()
        if b"content-length:" in low:
            n = int(low.split(b"content-length:")[1].split(b"\r\n")[0])
            while len(self.buf) < n:
                self._fill()
            self.buf = self.buf[n:]
        else:  # chunked: to the last chunk
            while b"\r\n0\r\n\r\n" not in self.buf and not self.buf.startswith(b"0\r\n\r\n"):
                self._fill()
            self.buf = self.buf.split(b"0\r\n\r\n", 1)[1]
        return time.perf_counter() - t0


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(pairs: int = 3000, stream: bool = False, warmup: int = 300) -> dict:
    up_port, px_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    up = subprocess.Popen([sys.executable, "-m", "bench.proxy_latency", "--serve-upstream", str(up_port)],
                          stdout=subprocess.PIPE, env=env, cwd=ROOT)
    tmp = tempfile.mkdtemp(prefix="proxy-bench-")
    px = subprocess.Popen([sys.executable, "-m", "slotlab.cli", "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
                           "--port", str(px_port), "--record", f"{tmp}/trace.json"], stderr=subprocess.PIPE, env=env,
                          cwd=ROOT)
    try:
        assert up.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", px_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or px.poll() is not None:
                    raise RuntimeError("slotlab proxy did not start")
                time.sleep(0.05)
        body = json.dumps({"prompt": "The capital of France is", "n_predict": 2, "temperature": 0,
                           **({"stream": True} if stream else {})}).encode()
        req = (b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Authorization: Bearer bench\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        direct, proxied = RawClient(up_port), RawClient(px_port)
        for _ in range(warmup):
            direct.exchange(req)
            proxied.exchange(req)
        d, p = [], []
        for i in range(pairs):
            if i % 2:
                d.append(direct.exchange(req))
                p.append(proxied.exchange(req))
            else:
                p.append(proxied.exchange(req))
                d.append(direct.exchange(req))
        ms = lambda x: round(x * 1e3, 3)  # noqa: E731
        diffs = [b - a for a, b in zip(d, p)]
        out = {"pairs": pairs, "stream": stream, "machine": f"{platform.machine()}, {os.cpu_count()} cpus, "
                                                             f"load {os.getloadavg()[0]:.2f}",
               "direct_ms": {"p50": ms(_pct(d, .5)), "p99": ms(_pct(d, .99))},
               "proxied_ms": {"p50": ms(_pct(p, .5)), "p99": ms(_pct(p, .99))},
               "added_ms": {"p50": ms(_pct(p, .5) - _pct(d, .5)), "p99": ms(_pct(p, .99) - _pct(d, .99))},
               "pair_diff_ms": {"p50": ms(_pct(diffs, .5)), "p99": ms(_pct(diffs, .99))}}
        out["ok"] = out["added_ms"]["p50"] <= 1.0 and out["added_ms"]["p99"] <= 5.0
        return out
    finally:
        px.terminate()
        up.terminate()
        for proc in (px, up):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.proxy_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--stream", action="store_true", help="only the SSE case (default: both)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    results = [run(args.pairs, stream=s) for s in ((True,) if args.stream else (False, True))]
    for r in results:
        kind = "SSE stream (16 events)" if r["stream"] else "JSON answer"
        print(f"{kind:<24} direct p50 {r['direct_ms']['p50']:.3f} p99 {r['direct_ms']['p99']:.3f} ms | proxied p50 "
              f"{r['proxied_ms']['p50']:.3f} p99 {r['proxied_ms']['p99']:.3f} ms | added p50 "
              f"{r['added_ms']['p50']:.3f} ms (goal <= 1), p99 {r['added_ms']['p99']:.3f} ms (goal <= 5) "
              f"{'OK' if r['ok'] else 'OVER'} [{r['machine']}]")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
