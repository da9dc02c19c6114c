"""`slotlab proxy`: a pass-through HTTP proxy in front of llama-server that records the traffic as a
slotlab trace (app.py: the proxy, record.py: the recorder).

    from slotlab.proxy import ProxyServer
    with ProxyServer("http://127.0.0.1:8080", port=8081, record="trace.json") as px:
        ...  # clients talk to px.url; px.recorder.trace() is the trace so far

Listens on 127.0.0.1 unless told otherwise; one asyncio event loop runs it (in a thread here)."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

from slotlab.errors import SlotlabError
from slotlab.proxy.app import Proxy, RequestInfo
from slotlab.proxy.record import Record, Recorder

__all__ = ["Proxy", "ProxyServer", "Record", "Recorder", "RequestInfo", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ProxyServer:
    """The proxy on its own asyncio loop in a background thread. `record`: a trace file kept current
    while it runs (written again on `stop()`); `flags`: the upstream server's flags, written into the
    trace; `on_record(record)`: told of every completed request (the twin view listens here);
    `keep_answers`: keep every answer's bytes in its record (else dropped once parsed)."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int | None = None,
                 record: str | Path | None = None, flags: list[str] | None = None, on_record=None,
                 keep_answers: bool = False, sim_fields: bool = False):
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.record_path = Path(record) if record else None
        self.recorder = Recorder(flags, upstream=self.upstream, on_record=on_record, keep_answers=keep_answers,
                                 sim_fields=sim_fields)
        self.app = Proxy(self.upstream, tap=self.recorder)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, timeout: float = 30) -> "ProxyServer":
        ready = threading.Event()
        loop = self._loop = asyncio.new_event_loop()

        def run():
            asyncio.set_event_loop(loop)
            server = None
            try:
                server = loop.run_until_complete(self.app.serve(self.host, self.port))
            except BaseException as exc:  # e.g. the port is taken
                self.error = exc
            ready.set()
            if server is None:
                loop.close()
                return
            try:
                loop.run_forever()
            finally:
                server.close()
                tasks = list(asyncio.all_tasks(loop))
                for t in tasks:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(self.app.aclose())
                loop.close()

        self._thread = threading.Thread(target=run, name="slotlab-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or self.error is not None:
            raise SlotlabError(f"slotlab proxy did not start on {self.host}:{self.port}: {self.error!r}")
        if self.record_path is not None:
            self.recorder.autosave(self.record_path)
        return self

    def serve_forever(self) -> None:
        """Block until interrupted (Ctrl-C), then stop."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self, timeout: float = 10) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self.recorder.close(self.record_path)

    def __enter__(self) -> "ProxyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
