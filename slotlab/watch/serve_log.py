"""`slotlab serve` that prints llama-server's log: its engine's decisions as the server's log lines.

    python -m slotlab.watch.serve_log -m MODEL --host 127.0.0.1 --port 8080 [llama-server flags]

is `slotlab serve` (the same flags, the same HTTP API) whose stdout is what `llama-server -lv 4`
prints for the same decisions: every engine event that carries the server's text, as
`<min>.<sec>.<ms>.<us> <L> slot <func>: id N | task T | <text>` (or `srv  <func>: <text>`), plus the
lines the engine has no event for but a log reader needs (the context's `n_ctx`, the model's `n_swa`,
`new slot`, the per-request `print_timing` lines, `model loaded`). It lets `slotlab watch -- ...` run
against slotlab's own server through exactly the path it takes for a real one (a child process's
output, read line by line), which is how tests/watch/test_live.py proves the watch without the
reference server."""

from __future__ import annotations

import sys
import threading
import time

from slotlab.engine import event_types as T
from slotlab.watch.patterns import match

LETTER = {"INF": "I", "TRC": "I", "WRN": "W", "ERR": "E", "DBG": "D"}


class LogWriter:
    """Writes events as llama-server log lines to `out` (thread-safe, flushed per line)."""

    def __init__(self, out=None, verbosity: int = 4):
        self.out = out or sys.stdout
        self.verbosity = verbosity
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()

    def _ts(self) -> str:
        us = int((time.perf_counter() - self.t0) * 1e6)
        return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"

    def line(self, level: str, text: str) -> None:
        lvl_n = {"ERR": 1, "WRN": 2, "INF": 3, "TRC": 4, "DBG": 5}.get(level, 3)
        if lvl_n > self.verbosity:
            return
        with self._lock:
            self.out.write(f"{self._ts()} {LETTER.get(level, 'I')} {text}\n")
            self.out.flush()

    def slot_line(self, level: str, func: str, slot: int, task: int, msg: str) -> None:
        self.line(level, f"slot {func[:12]:>12}: id {slot:2d} | task {task} | {msg}")

    def srv_line(self, level: str, func: str, msg: str) -> None:
        self.line(level, f"srv  {func[:12]:>12}: {msg}")

    def event(self, ev) -> None:
        if ev.kind == T.TASK_DONE:  # the server prints its timings just before the release line
            d = ev.payload
            for text in (f"prompt eval time =       0.00 ms / {d.prompt_n:5d} tokens (    0.00 ms per token,"
                         "     0.00 tokens per second)",
                         f"       eval time =       0.00 ms / {d.predicted_n:5d} tokens (    0.00 ms per token,"
                         "     0.00 tokens per second)"):
                self.slot_line("INF", "print_timing", ev.slot, ev.task, text)
            return
        if not ev.message:
            return
        func = str(ev.payload.func or ev.kind)
        if ev.slot >= 0 and match("slot", ev.message) is None and match("srv", ev.message) is not None:
            self.srv_line(ev.level, func, ev.message)  # the server prints its RAM-cache lines with SRV_*
        else:
            self.line(ev.level, ev.log_line())


def startup_lines(w: LogWriter, eng) -> None:
    """The start-up lines a reader needs that the engine emits no event for, then the engine's own."""
    ctx = getattr(eng, "ctx", None)
    n_ctx = getattr(ctx, "n_ctx", None) if ctx is not None else None
    w.srv_line("INF", "llama_server", "initializing ...")
    if n_ctx:
        w.line("INF", f"llama_context: n_ctx                 = {int(n_ctx)}")
    if getattr(eng.params, "swa_full", False):
        w.line("INF", "llama_kv_cache_iswa: using full-size SWA cache")
    model = eng.model
    n_swa = getattr(model, "n_swa", 0) if model is not None else 0
    if n_swa:
        w.line("INF", f"print_info: n_swa                 = {int(n_swa)}")
    for ev in list(eng.events.log):
        if ev.kind == T.INIT:
            w.event(ev)
            for s in eng.slots:
                w.slot_line("TRC", "load_model", s.id, -1, f"new slot, n_ctx = {eng.n_ctx_slot}")
        else:
            w.event(ev)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import uvicorn

    from slotlab.engine.params import ServerParams
    from slotlab.engine.scheduler import Engine
    from slotlab.serve import build_app

    params = ServerParams.from_args(argv)
    w = LogWriter(sys.stdout, verbosity=max(params.verbosity, 4))
    eng = Engine(params)
    startup_lines(w, eng)
    eng.events.subscribe(w.event)
    w.srv_line("INF", "llama_server", "model loaded")
    eng.start()
    w.srv_line("INF", "llama_server", f"listening on http://{params.host}:{params.port}")
    uvicorn.run(build_app(eng), host=params.host, port=params.port, log_level="warning", lifespan="off")
    eng.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
