"""What would have saved a miss: re-run the trace up to the missed request under a candidate flag
change and measure what that request reuses then.

`slotlab.explain` says which mechanism lost the tokens and names candidate flags for it (`Miss.suggest`);
this module tries them for real — the same decisions on the same requests, on a fresh engine over any
memory (the real model by default) — and keeps the smallest change that reuses more. A suggestion that
is not a flag (e.g. "more slots") is skipped."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable

from slotlab.engine.replay import Trace, replay
from slotlab.explain import Explainer, Miss


@dataclass
class Counterfactual:
    """One tried change: `flags` added to the trace's, what the request reused then, tokens saved."""

    flags: list[str]
    cache_n: int | None
    saved: int
    error: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Diagnosis:
    """A trace's misses with, for each, the tried changes and the best one."""

    misses: list[tuple[int, Miss]]  # (request index, miss)
    tried: dict[int, list[Counterfactual]] = field(default_factory=dict)
    lost_by_cause: dict[str, int] = field(default_factory=dict)

    def best(self, i: int) -> Counterfactual | None:
        good = [c for c in self.tried.get(i, []) if c.saved > 0]
        return max(good, key=lambda c: (c.saved, -len(c.flags)), default=None)

    def lines(self) -> list[str]:
        out = []
        for i, m in self.misses:
            b = self.best(i)
            tail = (f"; with {' '.join(b.flags)} it reuses {b.cache_n} ({b.saved} more)" if b is not None else
                    "; no tried flag change saved tokens" if self.tried.get(i) else "")
            out.append(f"#{i} {m.line()}{tail}")
        tot = ", ".join(f"{c} {n}" for c, n in sorted(self.lost_by_cause.items(), key=lambda kv: -kv[1]))
        out.append(f"tokens lost by cause: {tot or 'none'}")
        return out

    def as_json(self) -> dict:
        return {"misses": [{"request": i, **m.as_dict(), "tried": [c.as_dict() for c in self.tried.get(i, [])],
                            "best": None if self.best(i) is None else self.best(i).as_dict()} for i, m in self.misses],
                "lost_by_cause": dict(self.lost_by_cause)}


def flag_change(suggestion: str) -> list[str] | None:
    """`--ctx-checkpoints 64` -> ['--ctx-checkpoints', '64']; None for advice that is not a flag."""
    if not suggestion.startswith("-"):
        return None
    parts = shlex.split(suggestion)
    return parts if all(p.startswith("-") or not p.isalpha() or p.isdigit() for p in parts[1:]) or len(parts) <= 2 else None


def request_tasks(out: dict) -> list[int | None]:
    """The task id of each request of a replay (None for slot actions)."""
    return [None if t is None else t.id for t in out.get("tasks", [])]


def diagnose_trace(trace: Trace, *, model=None, memory_factory: Callable | None = None, max_misses: int = 5,
                   max_tries: int = 3, progress: Callable[[str], None] | None = None) -> Diagnosis:
    """Replay `trace`, find its misses, and try up to `max_tries` suggested flag changes for each of the
    first `max_misses` misses by replaying the trace up to that request with the change."""
    out = replay(trace, model=model, memory_factory=memory_factory)
    eng = out["engine"]
    x = Explainer().fold(eng.events.replayable())
    ids = request_tasks(out)
    by_task = {m.task: m for m in x.misses}
    misses = [(i, by_task[t]) for i, t in enumerate(ids) if t is not None and t in by_task]
    diag = Diagnosis(misses, lost_by_cause=dict(x.lost_by_cause))
    eng.close()
    for i, m in misses[:max_misses]:
        tried = []
        for s in m.suggest:
            fl = flag_change(s)
            if fl is None or len(tried) >= max_tries:
                continue
            if progress:
                progress(f"request {i}: trying {' '.join(fl)}")
            sub = Trace([*trace.flags, *fl], trace.requests[:i + 1], trace.path, trace.files)
            try:
                r = replay(sub, model=model, memory_factory=memory_factory)
                r["engine"].close()
                res = r["results"][i]
                cn = res.get("cache_n")
                tried.append(Counterfactual(fl, cn, (cn or 0) - m.n_past))
            except Exception as ex:  # a change the engine refuses (e.g. a flag this memory cannot take)
                tried.append(Counterfactual(fl, None, 0, f"{type(ex).__name__}: {ex}"))
        diag.tried[i] = tried
    return diag
