"""A reader feeding an EventBus: the bus gets every typed event (not the plain `log` lines until that
kind is in event_types), and a panel opened late on a trimmed bus shows what a fold of every event
shows."""

from pathlib import Path

import pytest

from slotlab.engine import event_types as T
from slotlab.engine.events import EventBus
from slotlab.panel.state import PanelState
from slotlab.watch.log_reader import LOG, LogReader

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"


def picture(st: PanelState) -> dict:
    return {"shape": (st.n_slots, st.n_ctx_slot, st.n_swa, st.cache_ram, list(st.flags)),
            "slots": {i: (s.state, s.task, s.n_tokens, s.n_past, s.prompt_n, s.origin, s.checkpoints, s.prov, s.why)
                      for i, s in st.slots.items()},
            "entries": dict(st.entries), "gauge": dict(st.gauge),
            "evictions": [x[2:] for x in st.evictions], "ckpt_marks": [x[1:] for x in st.ckpt_marks],
            "history": {i: list(h) for i, h in st.history.items()}, "why": list(st.why), "n_requests": st.n_requests}


@pytest.mark.parametrize("name", ["defaults_chat_checkpoints", "multi_tenant_defaults", "cache_ram_fifo_bytes"])
def test_a_late_panel_on_a_trimmed_bus(name):
    bus = EventBus(max_log=100)
    rd = LogReader(bus)
    events = rd.read_file(DIR / f"{name}.llama-server.log")
    assert rd.problems == [] and bus.n_trimmed > 0
    typed = [e for e in events if e.kind != LOG]
    assert bus.n_events == (len(typed) if LOG not in T.REGISTRY else len(events))
    assert picture(PanelState.from_bus(bus)) == picture(PanelState.rebuild(typed))
    assert picture(PanelState.rebuild(events)) == picture(PanelState.rebuild(typed))  # plain lines fold to nothing
