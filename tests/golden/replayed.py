"""One slotlab replay per golden trace per test session, shared by every test that needs it (the
golden comparison, the log reader's panel comparison): replaying 29 traces on the real model costs
minutes on 2 cores, so it is done once. The engine is closed; its results and events are kept."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from slotlab.engine.replay import load_trace, replay

DIR = Path(__file__).with_name("traces")
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)


@dataclass(frozen=True)
class Replayed:
    results: list
    events: list  # every event of the run (the bus keeps them all at this size)


@functools.lru_cache(maxsize=None)
def replayed(name: str, model) -> Replayed:
    """Trace `name` replayed on the stock server's flags (slotlab's slot-file appendices stay off)."""
    trace = load_trace(DIR / f"{name}.json")
    trace.flags = [*trace.flags, "--no-slot-appendices"]
    out = replay(trace, model=model)
    eng = out["engine"]
    try:
        return Replayed(out["results"], list(eng.events.replayable()))
    finally:
        eng.close()
