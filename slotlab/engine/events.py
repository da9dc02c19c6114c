"""Typed events: the contract between the engine and everything that watches it.

Every decision the engine makes is one immutable `Event`, emitted at the exact point of mutation,
carrying the server's own log text in `message` (so a real `llama-server -lv 4` log can be read side
by side), a level (ERR/WRN/INF/TRC/DBG as the server would print it), the slot and task, and the
numbers behind the decision in `data`. The panel, the replay report, metrics and the time slider are
folds over this one stream."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

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
    data: dict = field(default_factory=dict)

    def log_line(self) -> str:
        """The line as llama-server prints it: `slot <func>: id  N | task T | msg` or `srv  <func>: msg`."""
        func = str(self.data.get("func", self.kind))[:12]
        if self.slot >= 0:
            return f"slot {func:>12}: id {self.slot:2d} | task {self.task} | {self.message}"
        return f"srv  {func:>12}: {self.message}"

    def to_json(self) -> dict:
        return {"seq": self.seq, "t": round(self.t, 6), "kind": self.kind, "level": self.level,
                "slot": self.slot, "task": self.task, "message": self.message,
                "data": {k: _plain(v) for k, v in self.data.items() if not k.startswith("_")}}


def _plain(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 64 else f"<{v.size} tokens>"
    return repr(v)


class EventBus:
    """Fan-out to subscribers plus an in-memory log (bounded by `max_log`, oldest dropped)."""

    def __init__(self, max_log: int | None = 200_000):
        self._subs: list[Callable[[Event], None]] = []
        self._seq = itertools.count()
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self.max_log = max_log
        self.log: list[Event] = []

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Call `fn(event)` for every future event; returns the unsubscribe function."""
        self._subs.append(fn)
        return lambda: self._subs.remove(fn) if fn in self._subs else None

    def emit(self, kind: str, message: str = "", *, level: str = "TRC", slot: int = -1, task: int = -1,
             **data: Any) -> Event:
        with self._lock:
            ev = Event(next(self._seq), time.perf_counter() - self._t0, kind, level, message, slot, task, data)
            self.log.append(ev)
            if self.max_log is not None and len(self.log) > self.max_log:
                del self.log[: len(self.log) - self.max_log]
        for fn in list(self._subs):
            try:
                fn(ev)
            except Exception:  # a broken view must not stop the engine
                pass
        return ev

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
