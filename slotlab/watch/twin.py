"""The twin view: slotlab's own engine beside a real server, on the requests the server got, and the
first decision where the two differ.

    twin = Twin(["-np", "1", "-c", "2048", "--cache-ram", "12"])   # the server's flags (or others, to compare)
    twin.request({"prompt": ..., "n_predict": 2})                 # a trace request, in arrival order
    d = twin.diff(real_events)                                     # None: the same decisions so far

A `Twin` runs its engine in step mode in its own thread, one request after the other exactly as
`slotlab replay` runs a trace (a request marked `wait: false` only until it holds a slot). Fed by the
proxy (`attach(proxy_server)`: every request the proxy recorded, in arrival order) and compared with a
`Watch` (its events are the server's decisions read from the log), it is `slotlab watch --twin`.

What is compared, request by request in arrival order (task ids differ: the server numbers every HTTP
task), as one stream per side:

* `slot`: the slot the request was given;
* `cache_n`: its reused and processed prompt tokens (`cache_n`, `prompt_n`);
* every RAM-cache, checkpoint, shift, purge and retry decision the server logs (`server_log.PATTERNS`:
  saves, skips, evictions with their reason and size, loads with f_keep / f_sim, checkpoint creation /
  restore / erasure), with its numbers as printed. The `cache state` lines are gauges, not decisions,
  and are not compared (their limits differ as soon as the flags do).

Only what the server's log shows at its level is compared (a log below -lv 4 has no TRC lines, so only
slots, cache_n and the WRN decisions are), and only requests both sides have finished. `diff()`
returns the first `Difference` (the request, what differs, both sides' values and their log texts)."""

from __future__ import annotations

import collections
import queue
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterable

from slotlab.engine import event_types as T
from slotlab.engine.replay import is_chat
from slotlab.engine.server_log import decisions as _decisions
from slotlab.errors import SlotlabError

#: decisions the server logs at WRN (shown below -lv 4 too)
WRN_KINDS = frozenset(("skip_over_limit", "skip_entry_limit", "evict_make_room", "evict_byte_limit", "evict_token_limit", "purge",
                       "decode_retry", "checkpoint_evict_fifo", "cache_reuse_unsupported"))
#: log lines that are gauges, not decisions (their limits differ as soon as the flags do): not compared
GAUGES = frozenset(("state",))
#: what each decision kind is, in words
WHAT = {"slot": "slot", "cache_n": "cache_n / prompt_n", "status": "answer status", "save": "RAM-cache save", "skip_duplicate": "RAM-cache skip",
        "skip_over_limit": "RAM-cache skip (over the limit)", "skip_entry_limit": "RAM-cache skip (per-entry limit)",
        "lru_placed": "RAM-cache LRU placement", "evict_obsolete": "RAM-cache eviction (obsolete)",
        "evict_make_room": "RAM-cache eviction (make room)", "evict_byte_limit": "RAM-cache eviction (byte limit)",
        "evict_token_limit": "RAM-cache eviction (token limit)", "load": "RAM-cache load",
        "load_failed": "RAM-cache load failure", "state": "RAM-cache state", "purge": "slot purge",
        "decode_retry": "decode retry", "checkpoint_none": "checkpoint (none usable)",
        "checkpoint_restored": "checkpoint restore", "checkpoint_created": "checkpoint creation",
        "checkpoint_invalidated": "checkpoint erasure (invalidated)", "checkpoint_evict_fifo": "checkpoint eviction",
        "checkpoint_evict_too_close": "checkpoint erasure (too close)", "checkpoint_supersede": "checkpoint superseded",
        "shift": "cache-reuse shift", "cache_reuse_unsupported": "cache reuse unsupported"}


@dataclass(frozen=True)
class Decision:
    request: int  # index in arrival order
    kind: str  # slot / cache_n / a server_log kind
    values: tuple
    text: str  # the log text (or a description)


@dataclass(frozen=True)
class Difference:
    """The first decision where the server and slotlab differ (`real` / `twin` None: that side has no
    further decision of the request)."""

    request: int
    kind: str
    real: Decision | None
    twin: Decision | None
    position: int  # index in the compared streams
    extra: str = ""  # "twin" / "real": only that side made this decision (then the two agree again)

    def __str__(self) -> str:
        a, b = self.real, self.twin
        if self.extra == "twin":
            return (f"request {self.request}: slotlab made a {WHAT.get(b.kind, b.kind)} {_v(b)} that the server did "
                    f"not make")
        if self.extra == "real":
            return (f"request {self.request}: the server made a {WHAT.get(a.kind, a.kind)} {_v(a)} that slotlab did "
                    f"not make")
        if a is not None and b is not None and a.kind == b.kind:
            return (f"request {self.request}: {WHAT.get(a.kind, a.kind)} differs: server {_v(a)} "
                    f"\u2260 slotlab {_v(b)}")
        if a is not None:
            other = (f"slotlab's next decision is {WHAT.get(b.kind, b.kind)} {_v(b)}" if b is not None
                     else "slotlab has no further decision")
            return f"request {self.request}: the server made a {WHAT.get(a.kind, a.kind)} {_v(a)}; {other}"
        other = (f"the server's next decision is {WHAT.get(a.kind, a.kind)} {_v(a)}" if a is not None
                 else "the server has no further decision")
        return f"request {self.request}: slotlab made a {WHAT.get(b.kind, b.kind)} {_v(b)}; {other}"


def _v(d: Decision) -> str:
    return f"[{d.text}]"


def decision_stream(events: Iterable, *, upto: int | None = None, has_trc: bool = True) -> list[Decision]:
    """The RAM-cache / checkpoint / shift / purge / retry decisions of `events` (a reader's or an
    engine's) in the order they were made, each filed under the request launched last (arrival order);
    `upto`: only until request `upto` is launched; `has_trc`: False keeps what a -lv 3 log shows."""
    evs = list(events)
    launched = sorted({e.task for e in evs if e.kind == T.TASK_LAUNCHED and e.task >= 0})
    index = {t: i for i, t in enumerate(launched)}
    out: list[Decision] = []
    cur = -1
    for e in evs:
        k = e.kind
        if k == T.TASK_LAUNCHED and e.task in index:
            cur = index[e.task]
            if upto is not None and cur >= upto:
                break
        elif e.message and k != T.LOG:  # LOG: lines the reader does not map, and the watch's own notes
            for kind, *nums in _decisions([e.message]):
                if kind in GAUGES:
                    continue
                if has_trc or kind in WRN_KINDS:
                    out.append(Decision(index.get(e.task, max(cur, 0)), kind, tuple(nums), e.message.strip()))
    return out


def request_decisions(events: Iterable, upto: int | None = None) -> list[Decision]:
    """Per request in arrival order: the slot it was given and its cache_n / prompt_n (or its error)."""
    from slotlab.watch.log_reader import requests_json

    out = []
    for i, r in enumerate(x for x in requests_json(events) if "action" not in x):
        if upto is not None and i >= upto:
            break
        if r["status"] != 200:
            out.append(Decision(i, "status", (r["status"],), f"status {r['status']}"))
            continue
        out.append(Decision(i, "slot", (r["id_slot"],), f"slot {r['id_slot']}"))
        out.append(Decision(i, "cache_n", (r["cache_n"], r["prompt_n"]),
                            f"cache_n {r['cache_n']}, prompt_n {r['prompt_n']}"))
    return out


def first_difference(real: list[Decision], twin: list[Decision]) -> Difference | None:
    """The first position where two streams differ in a decision's kind or values (the request a
    decision is filed under is for the report: the server logs some RAM-cache lines with no task)."""
    key = lambda d: (d.kind, d.values)  # noqa: E731
    for i, (a, b) in enumerate(zip(real, twin)):
        if key(a) != key(b):
            extra = ""
            if i + 1 < len(twin) and key(twin[i + 1]) == key(a):
                extra = "twin"  # slotlab made a decision the server did not, then they agree again
            elif i + 1 < len(real) and key(real[i + 1]) == key(b):
                extra = "real"
            return Difference(a.request, (b if extra == "twin" else a).kind, a, b, i, extra)
    if len(real) != len(twin):
        i = min(len(real), len(twin))
        a = real[i] if i < len(real) else None
        b = twin[i] if i < len(twin) else None
        d = a or b
        return Difference(d.request, d.kind, a, b, i)
    return None


def compare(real_events: Iterable, twin_events: Iterable, *, upto: int | None = None,
            has_trc: bool = True, final: bool = True) -> Difference | None:
    """The first difference between two runs: per request (slot, cache_n / prompt_n, status) and in the
    sequence of cache decisions; of the two, the one at the earlier request (the cache decision on a tie:
    it is made before the request's answer). `final=False` (a run still going): one side's decisions
    being a prefix of the other's is no difference yet (the other side has not got there)."""
    real_events, twin_events = list(real_events), list(twin_events)
    per_req = first_difference(request_decisions(real_events, upto), request_decisions(twin_events, upto))
    seq = first_difference(decision_stream(real_events, upto=upto, has_trc=has_trc),
                           decision_stream(twin_events, upto=upto, has_trc=has_trc))
    if seq is not None and not final and (seq.real is None or seq.twin is None):
        seq = None
    if per_req is None or (seq is not None and seq.request <= per_req.request):
        return seq
    return per_req


def _n_done(events) -> int:
    return len({e.task for e in events if e.kind in (T.TASK_DONE, T.TASK_ERROR, T.TASK_CANCELLED) and e.task >= 0})


class Twin:
    """slotlab's engine on the requests a real server got (see the module docstring). `flags`: llama-server
    flags (the server's own for a fidelity check, others to see what they would change); `engine`: use
    this one instead (its events are compared)."""

    def __init__(self, flags: list[str] | None = None, *, model=None, engine=None):
        from slotlab.engine.replay import resolve_flags
        from slotlab.engine.scheduler import Engine

        self._tmp = None
        if engine is None:
            flags = resolve_flags(list(flags or []), model)
            if "--slot-save-path" not in flags:
                self._tmp = tempfile.TemporaryDirectory(prefix="slotlab-twin-")
                flags += ["--slot-save-path", self._tmp.name]
            engine = Engine(flags, model=model)
        self.engine = engine
        self.flags = list(flags or [])
        self.tasks: list = []  # (trace request, task) in the order run
        self.n_skipped = 0
        self.error: str | None = None
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._pending: dict[int, object] = {}  # proxy records that completed, by arrival index
        self._next = 0
        self._lock = threading.Lock()
        self.real = None  # a Watch (or anything with `events`) whose decisions are the server's
        self.last_diff: Difference | None = None

    @property
    def events(self):
        return self.engine.events

    # ------------------------------------------------------------------ feeding

    def request(self, r: dict, wait: bool | None = None) -> None:
        """Run trace request `r` (a completion or a slot action) after the ones before it."""
        if wait is not None:
            r = {**r, "wait": wait}
        self._idle.clear()
        self._q.put(r)
        self._ensure_thread()

    def attach(self, proxy_server) -> "Twin":
        """Be told of every request the proxy (a slotlab.proxy.ProxyServer) records, in arrival order."""
        rec = proxy_server.recorder
        prev = rec.on_record

        def on_record(record):
            if prev is not None:
                prev(record)
            self._on_record(rec, record)

        rec.on_record = on_record
        return self

    def _on_record(self, recorder, record) -> None:
        """Called in the proxy's event loop: only queue it (the twin's thread makes the trace request,
        which for a chat may ask the upstream for its template)."""
        self._idle.clear()
        self._q.put(("record", recorder, record))
        self._ensure_thread()

    def _from_record(self, recorder, record) -> list[dict]:
        """The trace requests that `record` completes, in arrival order (records finish out of order)."""
        out = []
        self._pending[record.index] = record
        while self._next in self._pending:
            rec = self._pending.pop(self._next)
            self._next += 1
            r = recorder.trace_request(rec)
            if r is None:
                self.n_skipped += 1
                continue
            nxt = recorder.record_after(rec)
            if "action" not in r and nxt is not None and rec.t_done is not None and nxt.t < rec.t_done:
                r["wait"] = False
            out.append(r)
        return out

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="slotlab-twin", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        from slotlab.engine.task import TaskState

        eng = self.engine
        ready: collections.deque = collections.deque()
        while True:
            try:
                item = ready.popleft() if ready else self._q.get(timeout=0.5)
            except queue.Empty:
                try:
                    eng.run_until_idle()
                except Exception as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                with self._lock:  # decide to end under the lock `_ensure_thread` takes: nothing is left behind
                    if self._q.empty():
                        self._idle.set()
                        self._thread = None
                        return
                continue
            if isinstance(item, tuple):  # a proxy record: it may complete several trace requests
                try:
                    ready.extend(self._from_record(item[1], item[2]))  # run next, before what is queued after
                except Exception as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                continue
            r = item
            try:
                if "action" in r:
                    t = eng.slot_action(r["action"], r["id_slot"], r.get("filename"))
                else:
                    t = eng.submit(r["prompt"], n_predict=r.get("n_predict", -1), id_slot=r.get("id_slot", -1),
                                   cache_prompt=r.get("cache_prompt"), n_cache_reuse=r.get("n_cache_reuse"),
                                   temperature=r.get("temperature", 0.0), seed=r.get("seed", 0xFFFFFFFF),
                                   ignore_eos=True, message_delimiters=r.get("message_delimiters"),
                                   chat=is_chat(r))
                self.tasks.append((r, t))
                if r.get("wait", True):
                    eng.run_until(lambda: t.done)
                else:
                    eng.run_until(lambda: t.done or t.state is TaskState.RUNNING)
            except Exception as exc:  # shown in summary(); the twin goes on with the next request
                self.error = f"{type(exc).__name__}: {exc}"
            if self._q.empty() and not ready:
                try:
                    eng.run_until_idle()
                except Exception as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                self._idle.set()

    def wait(self, timeout: float = 600) -> bool:
        """Until every request given so far has run (True) or `timeout` passed (False)."""
        return self._idle.wait(timeout)

    # ------------------------------------------------------------------ comparing

    def diff(self, real_events: Iterable | None = None, *, has_trc: bool | None = None) -> Difference | None:
        """The first differing decision between `real_events` (default: the attached watch's current
        server life) and the twin's, over the requests both have finished; None: none differs."""
        if real_events is None:
            if self.real is None:
                raise SlotlabError("nothing to compare with: give the server's events or attach a watch (watch.twin)")
            w = self.real
            evs = w.events.replay().events
            real_events = [e for e in evs if e.seq >= w.epochs[-1]]
            if has_trc is None:
                has_trc = w.reader.has_trc
        real_events = list(real_events)
        if has_trc is None:
            has_trc = any(e.level == "TRC" and e.message for e in real_events)
        with self.engine.locked():
            twin_events = self.engine.events.replay().events
        n_real, n_twin = _n_done(real_events), _n_done(twin_events)
        n = min(n_real, n_twin)
        final = self._idle.is_set() and self._q.empty() and n_real == n_twin
        self.last_diff = compare(real_events, twin_events, upto=n, has_trc=has_trc, final=final)
        self._n_compared = n
        return self.last_diff

    _n_compared = 0
    _key: tuple = ()
    _told = ""

    def summary(self) -> str:
        """One line: how many requests were compared and the first difference (for the panel header).
        With a watch attached, compares again when either side has new events, and a new first
        difference is also put on the watch's event list (an ERR `log` event)."""
        d = self.last_diff
        if self.real is not None:
            key = (self.real.events.n_events, self.engine.events.n_events)
            if key != self._key:
                self._key = key
                try:
                    d = self.diff()
                except Exception as exc:
                    return f"twin: comparison failed: {type(exc).__name__}: {exc}"
                if d is not None and str(d) != self._told:
                    self._told = str(d)
                    self.real.events.emit(T.Log(), f"slotlab twin: first difference: {d}", level="ERR")
        head = f"twin (slotlab {' '.join(self.flags)}): {self._n_compared} requests compared"
        if self.error:
            head += f" · twin error: {self.error}"
        if self.n_skipped:
            head += f" · {self.n_skipped} requests a trace cannot express skipped"
        return head + (f" · FIRST DIFFERENCE: {d}" if d else " · no difference")

    def close(self) -> None:
        self.wait(30)
        self.engine.close()
        if self._tmp is not None:
            self._tmp.cleanup()
