"""A running llama-server as a live event source: `Watch`, which the panel accepts like an engine.

    from slotlab.watch import Watch
    from slotlab.panel import Panel
    w = Watch(log="server.log", url="http://127.0.0.1:8080")           # follow a log, poll the server
    w = Watch(command=["llama-server", "-m", M, "-lv", "4", "--port", "8080"], url="http://127.0.0.1:8080")
    w.start(); Panel(w)                                                 # the same panel as for an Engine

Lines come from a followed log file (`tail -F`: rotation and truncation survive) or from a child
process's stdout + stderr; a `LogReader` turns them into typed events on `w.events` (an `EventBus`,
as `Engine.events`), so the panel, the "why" lines and `requests_json` fold them. With `url`, a
`ServerPoller` asks `/props`, `/slots` and `/metrics` every `poll` seconds for what the log does not
say (slot token counts and states while a request runs, n_ctx); the panel shows it in its header.

A server that dies, restarts or stops answering shows as `log` events (ERR / WRN / INF, text
`slotlab watch: ...`) in the event list and in the panel header. A new server life (the child was
restarted, or the followed log shows a new start-up) ends the old one on the bus: every RAM-cache
entry the old process held is evicted with reason `restart`, the gauges go to zero, every slot to an
empty idle snapshot, and a fresh `LogReader` reads the new process (its task ids start again, so
`results()` folds each life on its own). `epochs` holds the first event of each life.

Panel controls: `send` posts a `/completion` to `url` (in a thread), save / restore / erase post the
slot actions; stepping, pausing and clearing the RAM cache are not things a real server offers and
say so in the panel's status line.

The HTTP side: the server logs nothing for a successful slot save or restore, so `results()` takes
their answers from whoever saw them (`slotlab.watch.http_side.fill`): a recording proxy given to
`attach_recorder` (`slotlab watch --twin` / `--proxy-port`: every request), else the slot actions the
panel's controls sent."""

from __future__ import annotations

import html
import json
import threading
import time
from pathlib import Path
from typing import Callable

from slotlab.engine import event_types as T
from slotlab.engine.events import EventBus
from slotlab.engine.params import CACHE_RAM_MIB_DEFAULT
from slotlab.errors import SlotlabError
from slotlab.watch.follow import ChildProcess, FileFollower
from slotlab.watch.http_side import fill
from slotlab.watch.lines import parse_line
from slotlab.watch.log_reader import LogReader, requests_json
from slotlab.watch.poll import ServerPoller, auth_headers

#: seconds a child must have lived for its exit to count as a crash worth restarting (not a bad command line)
MIN_LIFE_FOR_RESTART = 2.0
#: what the panel says about token text (the server never logs it)
NO_TOKEN_TEXT = ("token text: llama-server's log has none, so the timelines show token counts and positions "
                 "only (no prompt text in the cache table, no text at the divergence mark)")


class _Sent:
    """A request the panel's controls sent to the server (answer in `result` / `error` when done)."""

    def __init__(self):
        self.error = None
        self.result = None
        self.done = threading.Event()


class Watch:
    """A live llama-server as an event source (see the module docstring). Use as a context manager or
    call `start()` / `stop()`."""

    def __init__(self, log: str | Path | None = None, *, command: list[str] | None = None, url: str | None = None,
                 api_key: str | None = None, poll: float = 1.0, from_start: bool = True, restarts: int = 0,
                 bus: EventBus | None = None, max_log: int | None = 200_000, interval: float = 0.02,
                 on_event: Callable | None = None):
        if log is None and not command and not url:
            raise SlotlabError("a watch needs a log file, a command to start, or a server URL")
        self.events = bus if bus is not None else EventBus(max_log)
        self.url = url.rstrip("/") if url else None
        # polling /slots and /metrics makes bare `all slots are idle` lines of its own: no unlogged actions
        self.reader = LogReader(self.events, unlogged=self.url is None)
        self.log_path = Path(log) if log else None
        self.command = list(command) if command else None
        self.api_key = api_key
        self.interval = interval
        self.restarts_left = restarts
        self.epochs: list[int] = [self.events.n_events]
        self.n_lives = 1
        self.exit_codes: list[int] = []
        self.state = "not started"  # running / exited (code) / stopped
        self.twin = None  # a slotlab.watch.twin.Twin, attached by `attach_twin`
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gauge: dict = {}
        self._props_init = False
        self._t_start = 0.0
        self._on_event = on_event
        self.recorder = None  # a slotlab.proxy Recorder that sees the clients' requests (attach_recorder)
        self._sent_actions: list[dict] = []  # the panel's slot actions, answered (with `_after`)
        self._n_launched = 0  # tasks launched so far (where a sent action falls among the completions)
        self.events.subscribe(self._observe)
        if self.command:
            self.child: ChildProcess | None = ChildProcess(self.command, tee=self.log_path)
            self.follower: FileFollower | None = None
        else:
            self.child = None
            self.follower = FileFollower(self.log_path, from_start=from_start) if self.log_path else None
        self.poller = (ServerPoller(self.url, api_key=api_key, period=poll, on_event=self._note,
                                    on_poll=self._polled) if self.url else None)

    # ------------------------------------------------------------------ life cycle

    def start(self) -> "Watch":
        """Start the child (if any), the poller and the reading thread; idempotent."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._t_start = time.time()
        if self.child is not None and self.child.proc is None:
            self._start_child()
        if self.poller is not None:
            self.poller.start()
        self.state = "running"
        self._thread = threading.Thread(target=self._loop, name="slotlab-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        """Stop reading (and the child: terminated, then killed after `timeout`); flush the reader."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.poller is not None:
            self.poller.stop()
        if self.child is not None:
            self.child.stop(timeout)
            self._drain()
        if self.follower is not None:
            self._drain()
            self.follower.close()
        with self._lock:
            self.reader.flush()
        if self.state == "running":
            self.state = "stopped"

    close = stop

    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start_child(self) -> None:
        try:
            self.child.start()
        except OSError as exc:
            self.state = f"could not start: {exc}"
            self._note("ERR", f"slotlab watch: could not start {self.command[0]}: {exc}")
            return
        self._note("INF", f"slotlab watch: started {' '.join(self.command[:1])} (pid {self.child.pid})")

    # ------------------------------------------------------------------ reading

    def _loop(self) -> None:
        while not self._stop.is_set():
            n = 0
            try:
                n = self._drain()
                if self.child is not None:
                    self._check_child()
            except Exception as exc:  # the watch must go on; the problem is shown
                self._note("ERR", f"slotlab watch: internal error: {type(exc).__name__}: {exc}")
            if n == 0:
                self._stop.wait(self.interval)

    def _drain(self) -> int:
        src = self.child if self.child is not None else self.follower
        if src is None:
            return 0
        lines = src.poll()
        if self.follower is not None:
            while self.follower.notes:
                self._note("WRN", "slotlab watch: " + self.follower.notes.popleft())
        for ln in lines:
            self.feed(ln)
        return len(lines)

    def feed(self, line: str | bytes) -> list:
        """One log line in (thread-safe); a new server start-up in the line begins a new life."""
        with self._lock:
            if self._is_startup(line):
                self.new_life("the log shows a new server start-up")
            return self.reader.feed(line)

    def _is_startup(self, line) -> bool:
        raw = line if isinstance(line, (bytes, bytearray)) else str(line).encode("utf-8", "replace")
        if b"initializing" not in raw[:4096]:
            return False
        ln = parse_line(line)
        if ln.src != "srv":
            return False
        seen_start = self.reader.startup_seen or self.reader.n_slots > 0
        if ln.msg.startswith("initializing ...") or ln.msg.startswith("initializing, n_slots"):
            return seen_start
        return False

    def _check_child(self) -> None:
        if self.state != "running":
            return
        rc = self.child.exited()
        if rc is None:
            return
        self._drain()
        lived = time.time() - self.child.started_at
        self.exit_codes.append(rc)
        self._note("ERR", f"slotlab watch: the server (pid {self.child.pid}) exited with code {rc} after "
                          f"{lived:.1f} s: its slots and RAM cache are gone")
        if self.restarts_left > 0 and lived >= MIN_LIFE_FOR_RESTART and not self._stop.is_set():
            self.restarts_left -= 1
            self.new_life(f"the server exited with code {rc}; restarting it")
            self._start_child()
        else:
            with self._lock:
                self.reader.flush()
            self.state = f"exited ({rc})"
            if self.restarts_left > 0:
                self._note("ERR", f"slotlab watch: not restarting: the server lived {lived:.1f} s "
                                  f"(< {MIN_LIFE_FOR_RESTART} s, a command-line problem?)")

    # ------------------------------------------------------------------ server lives

    def new_life(self, reason: str) -> None:
        """End the current server life on the bus (RAM cache evicted with reason `restart`, slots empty)
        and read what follows with a fresh reader."""
        with self._lock:
            rd = self.reader
            rd.flush()
            bus = self.events
            bus.emit(T.Log(), f"slotlab watch: new server life: {reason}", level="WRN")
            for e in list(rd.entries):
                bus.emit(T.CacheEvict(func="restart", reason="restart", entry_id=e.id, n_tokens=e.n_tokens,
                                      size=e.size),
                         f"slotlab watch: the server restarted: RAM-cache entry #{e.id} is gone", level="WRN")
            if self._gauge:
                bus.emit(T.CacheState(func="restart", **{**self._gauge, "n_entries": 0, "size": 0, "n_tokens": 0}), "")
            for i in sorted(rd.slots):
                bus.emit(T.SlotSnapshot(state="idle", n_tokens=0, n_prompt=0, n_past=0, prompt_n=0, n_gen=0,
                                        origin="slot", shifts=[], checkpoints=[]), "", slot=i, task=-1)
            self.reader = LogReader(bus, unlogged=self.url is None)
            self.epochs.append(bus.n_events)
            self.n_lives += 1
            self._props_init = False

    # ------------------------------------------------------------------ bus observers and notes

    def _observe(self, ev) -> None:
        if ev.kind == T.TASK_LAUNCHED:
            self._n_launched += 1
        if ev.kind == T.CACHE_STATE:
            self._gauge = {k: getattr(ev.payload, k) for k in ("n_entries", "size", "n_tokens", "limit_size", "limit_tokens",
                                                   "limit_tokens_cur")}
        if self._on_event is not None:
            self._on_event(ev)

    def _note(self, level: str, text: str) -> None:
        """A watch message as a `log` event (shown in the event list and the panel header)."""
        with self._lock:
            self.events.emit(T.Log(), text, level=level)
        self.last_note = (level, text, time.time())

    last_note: tuple | None = None

    def _polled(self, view) -> None:
        """After each poll: the shape from /props when the log gave none (attached to a running server),
        and the build when the log did not name it."""
        if view.up and self.reader.build.build is None:
            with self._lock:
                if self.reader.build.on_build_info(view.props.get("build_info")):
                    w = self.reader.build.warning()
                    if w is not None:
                        self.events.emit(T.Log(), w, level="WRN")
        if not view.up or self._props_init or view.n_slots is None:
            return
        rd = self.reader
        if rd.startup_seen:
            return
        if self.child is not None or (self.follower is not None and time.time() - self._t_start < 2.0):
            return  # the start-up lines will come (or may still come)
        with self._lock:
            self._props_init = True
            n, c = int(view.n_slots), int(view.n_ctx_slot or 0)
            self.events.emit(T.Init(n_slots=n, n_ctx_slot=c, kv_unified=False, n_swa=0, cache_ram=CACHE_RAM_MIB_DEFAULT,
                                    flags=["-np", str(n)], draft=False, sps=0.1),
                             "slotlab watch: no start-up lines in the log: the shape comes from GET /props "
                                     "(kv_unified, n_swa, --cache-ram not known)", level="INF")

    def attach_recorder(self, recorder):
        """The recording proxy in front of the server (a `slotlab.proxy.record.Recorder`): `results()`
        takes the slot actions' answers, which the log does not print, from it."""
        self.recorder = recorder
        return recorder

    def attach_twin(self, twin):
        """Show `twin` (a slotlab.watch.twin.Twin) beside this server: its first difference from the
        server's decisions goes into `status_lines()` / the panel header and the event list."""
        self.twin, twin.real = twin, self
        return twin

    # ------------------------------------------------------------------ what views read

    def results(self) -> list[dict]:
        """Per request, in `slotlab replay --json`'s schema, over every server life in order."""
        evs = self.events.replay().events
        out = []
        bounds = self.epochs + [float("inf")]
        for a, b in zip(bounds, bounds[1:]):
            out += requests_json(e for e in evs if a <= e.seq < b)
        if self.recorder is not None:
            return fill(out, [r for r in self.recorder.trace()["results"] if r is not None])
        if self._sent_actions:
            sent = list(self._sent_actions)
            return fill(out, sent, after=[r["_after"] for r in sent])
        return out

    @property
    def server(self):
        """The server as `/props`, `/slots`, `/metrics` last showed it (a `ServerView`; None without url)."""
        return self.poller.view if self.poller is not None else None

    def wait_for(self, pred: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> bool:
        """Poll `pred` until it holds or `timeout` passes (bounded); True when it held."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(step)
        return bool(pred())

    def status_lines(self) -> list[str]:
        """What the panel header and `slotlab watch` show about the source."""
        out = []
        if self.child is not None:
            out.append(f"child: {' '.join(self.command)[:120]} · pid {self.child.pid} · {self.state}"
                       + (f" · restarts left {self.restarts_left}" if self.restarts_left else ""))
        elif self.log_path is not None:
            f = self.follower
            out.append(f"log: {self.log_path} · {self.state} · {self.reader.n_lines} lines"
                       + (f" · rotated {f.n_rotations}x" if f and f.n_rotations else ""))
        if self.n_lives > 1:
            out.append(f"server lives: {self.n_lives} (exit codes {self.exit_codes or 'not seen'})")
        v = self.server
        if v is not None:
            if v.up is None:
                out.append(f"{v.url}: not polled yet")
            elif not v.up:
                out.append(f"{v.url}: DOWN ({v.error})")
            else:
                m = v.metrics
                out.append(f"{v.url}: up · n_ctx_slot {v.n_ctx_slot} · {v.n_slots} slots"
                           + (f" · prompt tokens {int(m.get('prompt_tokens_total', 0))}, predicted "
                              f"{int(m.get('tokens_predicted_total', 0))}, deferred {int(m.get('requests_deferred', 0))}"
                              if m else ""))
                out += v.slot_lines()
        if self.reader.n_lines:
            out.append(self.reader.build.line())  # the llama.cpp build the log names, and what its log lacks
        if self.reader.n_lines and not self.reader.has_trc:
            out.append("log below -lv 4 (no TRC lines): no similarity scores, RAM-cache saves / loads, checkpoints "
                       "or provenance; start the server with -lv 4 for those")
        out.append(NO_TOKEN_TEXT)
        if self.twin is not None:
            out.append(self.twin.summary())
        return out

    def panel_note(self) -> str:
        """HTML for the panel header (slotlab.panel.view shows it under the title)."""
        lines = self.status_lines()
        bad = ("DOWN", "exited", "could not")
        return "<br>".join((f"<b style='color:#b00'>{html.escape(s)}</b>" if any(b in s for b in bad)
                            else f"<small>{html.escape(s)}</small>") for s in lines)

    # ------------------------------------------------------------------ panel controls

    def _post(self, path: str, body: dict, action: str | None = None) -> _Sent:
        if not self.url:
            raise SlotlabError("this watch has no --url: it cannot send requests to the server")
        import httpx

        sent = _Sent()

        def run():
            try:
                r = httpx.post(self.url + path, json=body, headers=auth_headers(self.api_key), timeout=600,
                               trust_env=False)
                sent.result = (r.status_code, r.json() if r.content else None)
                if action is not None:  # the answer the log will not print
                    st, rep = sent.result
                    rep = rep if st == 200 else {"error": (rep or {}).get("error") if isinstance(rep, dict) else None}
                    self._sent_actions.append({"action": action, "status": st, "reply": rep,
                                               "_after": self._n_launched})
            except Exception as exc:
                sent.error = SlotlabError(f"{type(exc).__name__}: {exc}")
            sent.done.set()

        threading.Thread(target=run, name="slotlab-watch-send", daemon=True).start()
        return sent

    def submit(self, prompt, n_predict: int = -1, id_slot: int = -1, **fields) -> _Sent:
        """POST /completion to the watched server (answer in the returned object's `result`)."""
        return self._post("/completion", {"prompt": prompt, "n_predict": n_predict, "id_slot": id_slot, **fields})

    def slot_action(self, action: str, id_slot: int, filename: str | None = None) -> _Sent:
        body = {"filename": filename} if filename else {}
        return self._post(f"/slots/{int(id_slot)}?action={action}", body, action=action)

    def clear_cache(self):
        raise SlotlabError("llama-server has no endpoint that clears its RAM prompt cache")

    def _not_a_lab(self, *a, **k):
        raise SlotlabError("a real server runs on its own: it cannot be paused or stepped from the panel")

    step = run_until_idle = pause = _not_a_lab

    def resume(self) -> None:
        """Nothing to resume: a real server is always live (kept for the panel's run button)."""

    def __repr__(self) -> str:
        src = self.command or self.log_path or self.url
        return f"<Watch {json.dumps(str(src))[:80]} {self.state}, {self.events.n_events} events>"
