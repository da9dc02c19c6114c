"""The panel folded from a real llama-server's log equals the panel folded from slotlab's replay of the
same trace, on everything both have: per request (per slot, in order) cache_n, prompt_n and where the
reused tokens came from; the RAM-cache entries in FIFO order with their token counts, MiB and source
slot; every eviction with its reason, tokens and slot; the cache gauges; each slot's checkpoint chain
and the checkpoint marks; slot lengths at the end; purges and decode retries.

Not compared: task ids (the server numbers every HTTP task, slotlab only its own), the entries' text
head and exact bytes (the log prints MiB with 3 decimals: an entry's total and each checkpoint are
compared as printed, the sum of an entry's checkpoints is not, it can differ in the last decimal), the
score table and the "why" lines (the engine also scores silently where the server logs nothing)."""

import collections
from pathlib import Path

import pytest

from slotlab.engine import event_types as T
from slotlab.panel.state import PanelState
from slotlab.watch.log_reader import LogReader
from tests.golden.replayed import replayed

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)


def mib(n: int) -> float:
    return round(n / 2**20, 3)


def summary(events) -> dict:
    events = list(events)
    st = PanelState.rebuild(events)
    return {
        "shape": (st.n_slots, st.n_ctx_slot, st.n_swa, st.cache_ram),
        "history": {i: [(c, p, k) for _, c, p, k in h] for i, h in st.history.items() if h},
        "entries": [(e["id"], e["n_tokens"], mib(e["size"]), e["id_slot"],
                     [(a, b, n, mib(z)) for a, b, n, z in e["checkpoints"]]) for e in st.entries.values()],
        "evictions": [(reason, n, slot) for _, _, reason, n, slot in st.evictions],
        "evictions_by_reason": dict(collections.Counter(reason for _, _, reason, _, _ in st.evictions)),
        "gauge": {**st.gauge, "size": mib(st.gauge["size"])} if st.gauge else {},
        "chains": {i: [(a, b, n, mib(z)) for a, b, n, z, *_ in s.checkpoints] for i, s in st.slots.items()},
        "ckpt_marks": [m[1:] for m in st.ckpt_marks],
        "slot_tokens": {i: s.n_tokens for i, s in st.slots.items()},
        "n_requests": st.n_requests,
        "purges": [(e.payload.id_slot, e.payload.n_tokens) for e in events if e.kind == T.SLOT_PURGE],
        "retries": [(e.payload.ret, e.payload.off, e.payload.n_batch) for e in events if e.kind == T.DECODE_RETRY],
    }


@pytest.mark.parametrize("name", TRACES)
def test_panel_from_log_equals_panel_from_replay(model, name):
    ours = summary(replayed(name, model).events)  # the same replay the golden test compares (once a session)
    theirs = summary(LogReader().read_file(DIR / f"{name}.llama-server.log"))
    assert ours["n_requests"] > 0
    for key in ours:
        assert theirs[key] == ours[key], f"{name}: {key} differs"
