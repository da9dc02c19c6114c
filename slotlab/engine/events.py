"""Typed events: the contract between the engine and everything that watches it.

Every decision the engine makes is one immutable `Event`, emitted at the exact point of mutation,
carrying the server's own log text in `message` (so a real `llama-server -lv 4` log can be read side
by side), a level (ERR/WRN/INF/TRC/DBG as the server would print it), the slot and task, and the
numbers behind the decision in `payload`: an instance of its kind's class in
`slotlab.engine.event_types`, built by the producer (`bus.emit(T.Decode(off=0, ...), "", slot=1)`), so
a wrong field fails where the event is made and readers read attributes. The panel, the replay
report, metrics and the time slider are folds over this one stream.

The log is bounded; what the trimmed part defined (slots, RAM-cache entries, recent history) is
retained, so `replay()` still rebuilds the current picture for a view attached late. A subscriber
that raises is logged (logger `slotlab.events`, with its traceback), counted and kept in `errors` /
`last_error`; the other subscribers and the engine go on."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from slotlab.engine import event_types as _types

log = logging.getLogger("slotlab.events")

LEVELS = ("ERR", "WRN", "INF", "TRC", "DBG")


@dataclass(frozen=True)
class Event:
    seq: int  # position in the stream (0, 1, 2, ...)
    t: float  # seconds since the engine started
    kind: str  # e.g. "slot_selected", "cache_evict", "decode_retry"
    level: str  # ERR / WRN / INF / TRC / DBG
    message: str  # the server's log text for this step ("" where the server logs nothing)
    slot: int = -1
    task: int = -1
    payload: _types.Payload = None  # an instance of event_types.REGISTRY[kind]

    @property
    def data(self) -> dict:
        """The payload's reported fields as a dict (`payload.as_dict()`): for tables, notebooks and
        older code. Views read the payload's attributes."""
        return self.payload.as_dict()

    def log_line(self) -> str:
        """The line as llama-server prints it: `slot <func>: id  N | task T | msg` or `srv  <func>: msg`."""
        func = str(self.payload.func or self.kind)[:12]
        if self.slot >= 0:
            return f"slot {func:>12}: id {self.slot:2d} | task {self.task} | {self.message}"
        return f"srv  {func:>12}: {self.message}"

    def to_json(self) -> dict:
        return {"seq": self.seq, "t": round(self.t, 6), "kind": self.kind, "level": self.level,
                "slot": self.slot, "task": self.task, "message": self.message, "data": self.payload.to_json()}


@dataclass(frozen=True)
class SubscriberError:
    """A subscriber that raised: on which event, which subscriber, what (with the traceback)."""

    seq: int
    kind: str
    subscriber: str
    error: str  # "TypeError: ..."
    traceback: str
    when: float  # time.time()

    def __str__(self) -> str:
        return f"event subscriber {self.subscriber} raised on event #{self.seq} ({self.kind}): {self.error}"


_object_new = object.__new__


def _new_event(seq, t, kind, level, message, slot, task, payload) -> Event:
    """`Event(seq, t, kind, level, message, slot, task, payload)`, made as fast as a plain object: a
    frozen dataclass's `__init__` sets each field through `object.__setattr__`, which was a third of
    the cost of `EventBus.emit`. The instance is the same (its `__dict__` holds the fields in field
    order, as that `__init__` leaves it); `Event(...)` stays the public way to make one."""
    ev = _object_new(Event)
    d = ev.__dict__
    d["seq"] = seq
    d["t"] = t
    d["kind"] = kind
    d["level"] = level
    d["message"] = message
    d["slot"] = slot
    d["task"] = task
    d["payload"] = payload
    return ev


if tuple(f.name for f in dataclasses.fields(Event)) != ("seq", "t", "kind", "level", "message", "slot", "task", "payload"):
    raise AssertionError("Event's fields changed: update _new_event")  # pragma: no cover


class Replay(NamedTuple):
    """What a late subscriber rebuilds from: `EventBus.replay()`."""

    events: list  # retained events of the trimmed part + the log (up to `upto`), in seq order
    dropped: dict  # kind -> number of events gone for good (trimmed and not retained)
    first_seq: int  # seq of the oldest event still in the log: the first a time slider can show
    n_trimmed: int  # events trimmed from the log so far


#: how many subscriber errors are logged with their traceback before only every 1000th is
LOG_FIRST_ERRORS = 20


class EventBus:
    """Fan-out to subscribers plus an in-memory log (bounded by `max_log`, oldest dropped).

    `max_log`: the log holds at most this many events; when it overflows, the oldest are trimmed in
    chunks of `trim_chunk` (default 2 % of `max_log`), so trimming costs O(1) per event. Trimmed events
    are passed through `event_types.RETAIN`: the ones that define the current picture (init, the last
    snapshot of each slot, live RAM-cache entries, the cache gauges, recent history) are kept, and
    `replay()` returns them with the log. `dropped` counts, per kind, the events that are gone.

    Subscribers run in the emitting thread, after the event is logged. One that raises is logged
    (logger `slotlab.events`, with the traceback: the first 20, then every 1000th), counted in
    `n_errors`, kept in `errors` (the last 50) / `last_error`; the others still get the event."""

    def __init__(self, max_log: int | None = 200_000, *, trim_chunk: int | None = None):
        # a tuple, replaced (never changed in place) by subscribe / unsubscribe: a delivery iterates
        # the tuple it read, which is the snapshot `list(self._subs)` used to copy on every event
        self._subs: tuple[Callable[[Event], None], ...] = ()
        self._n = 0
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        # the kinds anyone reads (None: all). A simulation whose only reader folds a few kinds sets it
        # (slotlab.sim.simulate): the other events are numbered but neither built nor logged
        self.only: frozenset | None = None
        self.max_log = max_log
        self.trim_chunk = max(1, trim_chunk if trim_chunk is not None else (max_log or 0) // 50)
        self.log: list[Event] = []
        self.n_trimmed = 0
        self.dropped: collections.Counter = collections.Counter()
        self.errors: collections.deque[SubscriberError] = collections.deque(maxlen=50)
        self.n_errors = 0
        self._rules: dict[str, list] = {}
        self._until: dict[str, list] = {}
        for r in _types.RETAIN:
            for k in r.kinds:
                self._rules.setdefault(k, []).append(r)
            for k in r.until:
                self._until.setdefault(k, []).append(r)
        self._boxes: dict[str, collections.OrderedDict] = {r.name: collections.OrderedDict() for r in _types.RETAIN}
        self._held: dict[int, list] = {}  # seq -> [event, number of rules holding it]
        self._tl = threading.local()  # per emitting thread: events waiting for the current delivery to end

    def wants(self, kind: str) -> bool:
        """Whether an event of `kind` would be logged and delivered (see `only`): a producer whose
        payload is costly to build asks first."""
        return self.only is None or kind in self.only

    def skip(self, n: int = 1) -> None:
        """Number `n` events of kinds `wants` refused without building them (as `emit` numbers them)."""
        self._n += n

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Call `fn(event)` for every future event; returns the unsubscribe function."""
        self._subs = self._subs + (fn,)

        def unsubscribe() -> None:
            subs = list(self._subs)
            if fn in subs:
                subs.remove(fn)
                self._subs = tuple(subs)

        return unsubscribe

    def emit(self, payload: _types.Payload, message: str = "", *, level: str = "TRC", slot: int = -1,
             task: int = -1) -> Event:
        """Log and deliver the event whose numbers are `payload` (its class gives the kind).

        Events are delivered in seq order. An event emitted by a subscriber while another is being
        delivered (a derived event, e.g. slotlab.explain's request_miss) is logged at once but
        delivered only after the current event has reached every subscriber: no subscriber sees
        event N+1 before N.

        This runs once per engine decision (a simulation emits millions), so its fixed cost is kept
        small: the Event is built without the frozen dataclass's per-field `object.__setattr__`
        (`_new_event`, the same fields in the same order), the subscribers are an immutable tuple
        (no copy per event), and the per-thread queue of derived events is a list made only when a
        delivery starts; the event being emitted is delivered directly, the queue holds the derived
        ones."""
        only = self.only
        if only is not None and payload.KIND not in only:
            self._n += 1  # numbered as if logged: the seqs of the events that are kept do not change
            return None
        with self._lock:
            ev = _new_event(self._n, time.perf_counter() - self._t0, payload.KIND, level, message, slot, task, payload)
            self._n += 1
            self.log.append(ev)
            if self.max_log is not None and len(self.log) > self.max_log:
                self._trim()
        tl = self._tl
        pending = getattr(tl, "pending", None)
        if pending is not None:  # inside a delivery of this thread: delivered when it has ended
            pending.append(ev)
            return ev
        tl.pending = pending = []
        try:
            cur, i = ev, 0
            while True:
                for fn in self._subs:
                    try:
                        fn(cur)
                    except Exception as exc:  # a broken view must not stop the engine, but it is reported
                        self._subscriber_failed(fn, cur, exc)
                if i == len(pending):
                    break
                cur = pending[i]
                i += 1
        finally:
            tl.pending = None
        return ev

    # ------------------------------------------------------------------ errors

    @property
    def last_error(self) -> str | None:
        """The last subscriber error as one line (None: none so far)."""
        return str(self.errors[-1]) if self.errors else None

    def _subscriber_failed(self, fn, ev: Event, exc: Exception) -> None:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        err = SubscriberError(ev.seq, ev.kind, name, f"{type(exc).__name__}: {exc}",
                              "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), time.time())
        with self._lock:
            self.n_errors += 1
            n = self.n_errors
            self.errors.append(err)
        if n <= LOG_FIRST_ERRORS or n % 1000 == 0:
            more = " (further ones: every 1000th is logged)" if n == LOG_FIRST_ERRORS else ""
            log.error("%s; the engine goes on (%d subscriber error(s) so far%s)", err, n, more, exc_info=exc)

    # ------------------------------------------------------------------ trimming and retention

    def _trim(self) -> None:
        """Drop the oldest events (at least `trim_chunk`) and pass them through the retention rules."""
        n = min(len(self.log), max(len(self.log) - self.max_log, self.trim_chunk))
        gone = self.log[:n]
        del self.log[:n]
        self.n_trimmed += n
        # most trimmed events are of kinds no rule keeps or ends (decode, prompt_batch, ...): for them
        # `_retain` would only count the drop, so that is done here without the call
        rules, until, dropped, retain = self._rules, self._until, self.dropped, self._retain
        for ev in gone:
            k = ev.kind
            if k in rules or k in until:
                retain(ev)
            else:
                dropped[k] += 1

    def _retain(self, ev: Event) -> None:
        for r in self._until.get(ev.kind, ()):
            box = self._boxes[r.name].pop(r.key(ev), None)
            for old in box or ():
                self._release(old)
        held = 0
        for r in self._rules.get(ev.kind, ()):
            if r.when is not None and not r.when(ev):
                continue
            boxes = self._boxes[r.name]
            key = r.key(ev)
            box = boxes.get(key)
            if box is None:
                if len(boxes) >= r.max_keys:
                    for old in boxes.popitem(last=False)[1]:
                        self._release(old)
                box = boxes[key] = collections.deque()
            elif len(box) >= r.keep:
                self._release(box.popleft())
            box.append(ev)
            held += 1
        if held:
            self._held[ev.seq] = [ev, held]
        else:
            self.dropped[ev.kind] += 1

    def _release(self, ev: Event) -> None:
        h = self._held[ev.seq]
        h[1] -= 1
        if h[1] == 0:
            del self._held[ev.seq]
            self.dropped[ev.kind] += 1

    @property
    def first_seq(self) -> int:
        """Seq of the oldest event still in the log (0 until something is trimmed)."""
        try:
            return self.log[0].seq
        except IndexError:
            return self._n

    @property
    def n_events(self) -> int:
        """Events emitted so far (the next event's seq)."""
        return self._n

    @property
    def retained(self) -> list[Event]:
        """The events kept from the trimmed part of the log (see `event_types.RETAIN`), in seq order."""
        with self._lock:
            return sorted((h[0] for h in self._held.values()), key=lambda e: e.seq)

    def replay(self, upto: int | None = None) -> Replay:
        """What a late subscriber needs to rebuild the picture as of event `upto` (default: the last):
        the retained events of the trimmed part then the log, in seq order, with the per-kind counts of
        the events that are gone. Exact for any `upto >= first_seq - 1`; earlier than that only what was
        retained remains."""
        with self._lock:
            base = sorted((h[0] for h in self._held.values()), key=lambda e: e.seq)
            first = self.log[0].seq if self.log else self._n
            if upto is None:
                tail = list(self.log)
            else:
                tail = self.log[: max(0, upto - first + 1)]  # the log's seqs are contiguous
                base = [e for e in base if e.seq <= upto]
            return Replay(base + tail, dict(self.dropped), first, self.n_trimmed)

    def replayable(self, upto: int | None = None) -> list[Event]:
        """`replay(upto).events`."""
        return self.replay(upto).events

    # ------------------------------------------------------------------ reading the log

    def filter(self, kinds: Iterable[str] | None = None, slot: int | None = None) -> list[Event]:
        ks = set(kinds) if kinds is not None else None
        return [e for e in self.log if (ks is None or e.kind in ks) and (slot is None or e.slot == slot)]

    def to_jsonl(self, path) -> int:
        """Write the log as JSON lines; returns the number of events written."""
        with open(path, "w") as f:
            for e in self.log:
                f.write(json.dumps(e.to_json()) + "\n")
        return len(self.log)

    def to_dataframe(self):
        """The log as a pandas DataFrame (pandas is optional)."""
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover
            raise ImportError("to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame([e.to_json() for e in self.log])
