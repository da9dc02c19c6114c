"""A scripted HTTP/1.1 upstream for proxy tests: it answers each path with fixed raw bytes (written in
the pieces given, so chunk boundaries fall anywhere), records every request's raw bytes, and for
`/slow` (or a body with `"slow": true`) streams a chunk every 20 ms until its client (the proxy) closes the connection, noting when."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time

SSE_EVENTS = [{"content": "Hel", "stop": False}, {"content": "lo \u00e9\u00e8", "stop": False},
              {"content": "", "stop": True, "id_slot": 1, "tokens_predicted": 2, "tokens_evaluated": 7,
               "tokens_cached": 8, "timings": {"cache_n": 3, "prompt_n": 4}}]
SSE_BODY = b"".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n".encode() for e in SSE_EVENTS)


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` as chunked transfer coding, with chunk boundaries at `cuts` and a trailer; written in
    pieces that cut through the framing too."""
    parts, prev = [], 0
    for c in [*cuts, len(data)]:
        piece = data[prev:c]
        parts.append(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        prev = c
    parts.append(b"0\r\nX-Trailer: t\r\n\r\n")
    raw = b"".join(parts)
    return [raw[i:i + 7] for i in range(0, len(raw), 7)]


JSON_BODY = b'{"content":"hi","id_slot":0,"tokens_predicted":1,"tokens_evaluated":5,"tokens_cached":6,' \
            b'"timings":{"cache_n":0,"prompt_n":5}}'
GZ = gzip.compress(JSON_BODY, mtime=0)
DENIED = b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}'

RESPONSES = {
    "/json": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Odd:  spaced  value\r\nSet-Cookie: a=1\r\n"
              b"Set-Cookie: b=2\r\nContent-Length: " + str(len(JSON_BODY)).encode() + b"\r\n\r\n", JSON_BODY],
    "/completion": [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                    *_chunked(SSE_BODY, [5, 23, 40, 41, 90])],
    "/close": [b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", b"until ", b"the end", None],
    "/denied": [b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(DENIED)).encode() + b"\r\n\r\n", DENIED],
    "/gzip": [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: "
              + str(len(GZ)).encode() + b"\r\n\r\n", GZ],
    "/empty": [b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n"],
}


class FakeUpstream:
    def __init__(self):
        self.requests: list[bytes] = []  # raw request bytes (head + body), in order
        self.connections = 0
        self.slow_closed_at: float | None = None  # when the proxy closed a /slow connection
        self.slow_started_at: float | None = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "FakeUpstream":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _shutdown(self) -> None:
        self._srv.close()
        tasks = list(asyncio.all_tasks(self._loop))
        for t in tasks:
            t.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        srv = self._srv = self._loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = srv.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._shutdown()

    async def _conn(self, reader, writer) -> None:
        self.connections += 1
        try:
            await self._serve(reader, writer)
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader, writer) -> None:
        while True:
            if True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":", 1)[1])
                body = await reader.readexactly(n) if n else b""
                self.requests.append(head + body)
                path = head.split(b" ", 2)[1].split(b"?")[0].decode()
                if path == "/slow" or b'"slow": true' in body:
                    await self._slow(reader, writer)
                    return
                for piece in RESPONSES.get(path, RESPONSES["/json"]):
                    if piece is None:  # close-delimited: the end of the body is the end of the connection
                        await writer.drain()
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)

    async def _slow(self, reader, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.slow_started_at = time.monotonic()
        eof = asyncio.ensure_future(reader.read(1))
        for i in range(500):  # 10 s at most
            data = f"data: {{\"content\": \"t{i}\", \"stop\": false}}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            try:
                await writer.drain()
            except ConnectionError:
                break
            try:
                await asyncio.wait_for(asyncio.shield(eof), 0.02)
            except asyncio.TimeoutError:
                continue
            break
        self.slow_closed_at = time.monotonic()
        eof.cancel()
