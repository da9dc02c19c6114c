"""Live: `slotlab watch -- SERVER ...` (a `Watch` over a child process, read line by line, with /props,
/slots and /metrics polled) feeding the panel, while a scenario runs against the server: the panel
state shows each request, the checkpoint restore, the RAM-cache eviction and the load within 1 s of
the HTTP answer. Then the server is killed: the panel shows it exited, the watch restarts it, the
old RAM cache is shown gone (evicted, reason `restart`), and the next request shows again.

Two servers, the same test:
* the reference llama-server (`make llama-server`; skipped with a message when it is not built), run
  with `-lv 4` as the README asks;
* `slotlab serve` (always): `python -m slotlab.watch.serve_log`, which is `slotlab serve` printing its
  engine's decisions as llama-server's log lines, so the watch reads it through the same child-process
  path (slotlab serve itself writes no server-format log)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import httpx
import pytest

from bench.build_llama_server import server_binary
from slotlab.llama.model import default_model_path
from slotlab.panel import Panel
from slotlab.watch import Watch
from tests.watch.scenario import FLAGS, REQUESTS, body

pytestmark = pytest.mark.slow

LIMIT = 1.0  # seconds from the HTTP answer to the panel showing it


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(kind: str, port: int) -> list[str]:
    common = ["-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port), "--no-repack", "-t", "2",
              *FLAGS]
    if kind == "llama-server":
        return [str(server_binary()), *common, "--no-webui", "-lv", "4"]
    return [sys.executable, "-m", "slotlab.watch.serve_log", *common]


def wait_healthy(url: str, watch: Watch, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert not watch.state.startswith(("exited", "could not")), watch.status_lines()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"server at {url} not healthy after {timeout} s")


def shown_within(panel: Panel, pred, limit: float = LIMIT) -> float | None:
    """Seconds until `pred(panel)` held (refreshing the panel as its pump would), None after `limit`."""
    t0 = time.monotonic()
    while True:
        panel.refresh()
        if pred(panel):
            return time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            return None
        time.sleep(0.01)


def last(panel: Panel):
    h = panel.state.history.get(0)
    return h[-1] if h else None


# what each request of the scenario must show on the panel, besides its own numbers
EXPECT = {
    1: ("a checkpoint restore", lambda p: any(m[2] == "restored" and m[1] == 0 for m in p.state.ckpt_marks)),
    4: ("a RAM-cache eviction (make_room)", lambda p: any(e[2] == "make_room" for e in p.state.evictions)),
    5: ("a load from the RAM cache", lambda p: any(e[2] == "loaded" for e in p.state.evictions)
        and last(p)[1] > 0),
}


@pytest.mark.parametrize("kind", ["slotlab", "llama-server"])
def test_watch_a_live_server(kind):
    if kind == "llama-server" and server_binary() is None:
        pytest.skip("the reference llama-server is not built (run `make llama-server`): only slotlab serve is watched")
    port = _port()
    url = f"http://127.0.0.1:{port}"
    timings = {}
    with Watch(command=command(kind, port), url=url, poll=0.5, restarts=1) as watch:
        panel = Panel(watch)
        wait_healthy(url, watch)
        with httpx.Client(base_url=url, timeout=600) as c:
            for i, r in enumerate(REQUESTS):
                ans = c.post("/completion", json=body(r)).json()
                want = ans["timings"]["cache_n"], ans["timings"]["prompt_n"]

                def done(p, i=i, want=want):
                    h = last(p)
                    return p.state.n_requests == i + 1 and h is not None and (h[1], h[2]) == want

                dt = shown_within(panel, done)
                assert dt is not None, f"{kind}: request {i} ({want}) not on the panel within {LIMIT} s: " \
                                       f"{panel.state.n_requests} requests, last {last(panel)}"
                timings[f"request {i}"] = dt
                if i in EXPECT:
                    what, pred = EXPECT[i]
                    dt = shown_within(panel, pred)
                    assert dt is not None, f"{kind}: {what} not on the panel within {LIMIT} s after request {i}"
                    timings[what] = dt
            assert watch.server.up and watch.server.n_ctx_slot == 2048  # /props polled
            assert watch.wait_for(lambda: any("slot 0: idle" in s for s in watch.status_lines()), 5), \
                watch.status_lines()  # /slots polled (the next poll after the last answer)
            assert "token counts and positions only" in panel.header.value

            # the server dies: shown, restarted, the old RAM cache gone, watching resumes
            n_before = panel.state.n_requests
            os.kill(watch.child.pid, signal.SIGKILL)
            dt = shown_within(panel, lambda p: "exited with code -9" in p.events_box.value, limit=5)
            assert dt is not None, f"{kind}: the dead server is not shown: {watch.status_lines()}"
            assert shown_within(panel, lambda p: not p.state.entries and any(e[2] == "restart"
                                                                             for e in p.state.evictions), limit=5)
            wait_healthy(url, watch)
            assert watch.n_lives == 2 and "server lives: 2" in panel.header.value
            ans = c.post("/completion", json=body(REQUESTS[0])).json()
            dt = shown_within(panel, lambda p: p.state.n_requests == n_before + 1
                              and last(p)[1:3] == (ans["timings"]["cache_n"], ans["timings"]["prompt_n"]))
            assert dt is not None, f"{kind}: watching did not resume after the restart"
            timings["after restart"] = dt
        results = watch.results()
        panel.close()
    assert len(results) == len(REQUESTS) + 1 and all(r["status"] == 200 for r in results)
    print(f"\n{kind}: seconds from the HTTP answer to the panel: "
          + ", ".join(f"{k} {v:.3f}" for k, v in timings.items()))


@pytest.mark.parametrize("kind", ["slotlab", "llama-server"])
def test_twin_beside_a_live_server(kind):
    """`slotlab watch --twin`: the scenario goes through the recording proxy; a twin with the server's
    flags makes the same decisions (no difference, also in the panel header); a twin with a smaller RAM
    cache (`--cache-ram 6`, less than one prompt with its checkpoints) reports its first differing
    decision: at request 2 the server saves prompt A, the twin skips it as over the limit."""
    if kind == "llama-server" and server_binary() is None:
        pytest.skip("the reference llama-server is not built (run `make llama-server`): only slotlab serve is twinned")
    from slotlab.proxy import ProxyServer
    from slotlab.watch.twin import Twin

    port = _port()
    url = f"http://127.0.0.1:{port}"
    smaller = [*FLAGS[:-1], "6"]
    assert FLAGS[-2] == "--cache-ram"
    with Watch(command=command(kind, port), url=url, poll=1.0) as watch, ProxyServer(url, flags=FLAGS) as px:
        same = watch.attach_twin(Twin(FLAGS))
        other = Twin(smaller)
        other.real = watch
        same.attach(px)
        other.attach(px)
        panel = Panel(watch)
        wait_healthy(url, watch)
        with httpx.Client(base_url=px.url, timeout=600) as c:
            for r in REQUESTS:
                assert c.post("/completion", json=body(r)).status_code == 200
        assert same.wait(600) and other.wait(600) and same.error is None and other.error is None
        assert watch.wait_for(lambda: len(watch.results()) == len(REQUESTS), 5)
        d = same.diff()
        assert d is None and same._n_compared == len(REQUESTS), str(d)
        assert shown_within(panel, lambda p: f"{len(REQUESTS)} requests compared · no difference" in p.header.value,
                            limit=3) is not None
        d = other.diff()  # A with its checkpoints (~10 MiB) no longer fits: saved by the server, skipped by the twin
        assert d is not None and d.request == 2 and d.twin is not None and d.twin.kind == "skip_over_limit", str(d)
        print(f"\n{kind}: twin --cache-ram 6: {d}")
        panel.close()
        same.close()
        other.close()
