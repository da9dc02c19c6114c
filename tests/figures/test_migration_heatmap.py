"""slotlab.figures.migration and .reuse_heatmap on the fake memory: the folds read the right moves and
causes from a real engine's events, and the pictures render as small PNGs (no model, seconds)."""

from __future__ import annotations

from slotlab.engine.scheduler import Engine
from slotlab.figures import png
from slotlab.figures.migration import migration_figure, migrations, timeline
from slotlab.figures.reuse_heatmap import HITS, NEW, heatmap_figure, outcomes
from slotlab.memory.fake import FakeMemory

DOC = lambda topic: " ".join(f"Note {i} on {topic}: item {i * 7} is on shelf {i % 5}." for i in range(6))  # noqa: E731
PROMPTS = [DOC("rivers"), DOC("caves"), DOC("lakes"), DOC("rivers") + " More?"]
NAMES = {0: "rivers", 1: "caves", 2: "lakes"}


def run(flags: str, prompts=PROMPTS, **mem) -> Engine:
    mem.setdefault("n_slots", 2)
    e = Engine(flags, memory=FakeMemory(**mem))
    for p in prompts:
        t = e.submit(p, n_predict=3, ignore_eos=True)
        e.run_until(lambda: t.done)
        assert t.error is None, t.error
    return e


def test_unified_idle_slot_save_clear_then_load_in_another_slot():
    e = run("-np 2 -kvu -c 4096", kv_unified=True)
    tl = timeline(e, NAMES)
    assert [(r.slot, r.conv) for r in tl.requests] == [(1, "rivers"), (0, "caves"), (1, "lakes"), (0, "rivers")]
    assert migrations(tl) == [("rivers", 1, 0, 0)]
    saves = [(m.kind, m.slot, m.entry_id, m.conv) for m in tl.moves if m.kind != "load"]
    assert saves == [("idle_save", 1, 0, "rivers"), ("idle_save", 0, 1, "caves"), ("idle_save", 1, 2, "lakes")]
    # unified: each idle slot's content ends with the clear right after the save
    assert [sp.end for sp in tl.slots if sp.end] == ["idle_clear", "idle_clear", "idle_clear"]
    assert tl.requests[-1].cache_n > 0
    assert len(png.to_png(migration_figure(e, NAMES))) < png.MAX_BYTES


def test_not_unified_copies_idle_slots_and_keeps_them():
    e = run("-np 2 -c 4096")
    tl = timeline(e, NAMES)
    assert migrations(tl) == [("rivers", 1, 0, 0)]
    assert not any(sp.end == "idle_clear" for sp in tl.slots)  # copied, never cleared
    assert sum(m.kind == "idle_save" for m in tl.moves) == 3
    off = timeline(run("-np 2 -c 4096 --cache-ram 0"), NAMES)
    assert off.moves == [] and off.entries == [] and migrations(off) == []


def test_a_save_at_selection_is_not_an_idle_slot_save():
    """One slot: the LRU choice saves the slot it is about to reuse (spec 1.4), no idle slot exists."""
    e = run("-np 1 -c 4096", prompts=[DOC("rivers"), DOC("caves"), DOC("rivers") + " More?"], n_slots=1)
    tl = timeline(e, NAMES)
    assert [(m.kind, m.slot, m.entry_id, m.conv) for m in tl.moves] == [
        ("select_save", 0, 0, "rivers"), ("select_save", 0, 1, "caves"), ("load", 0, 0, "rivers")]
    assert migrations(tl) == []  # back into the slot it left


def test_conversations_are_named_by_what_they_reuse():
    tl = timeline(run("-np 2 -kvu -c 4096", kv_unified=True))
    assert [r.conv for r in tl.requests] == ["A", "B", "C", "A"]


def test_heatmap_outcomes_hits_and_misses():
    e = run("-np 2 -kvu -c 4096", kv_unified=True)
    outs = outcomes(e)
    assert [o.category for o in outs][-1] == "RAM-cache hit" and outs[-1].origin == "cache #0"
    assert all(o.category in (NEW, "threshold") for o in outs[:3])  # new topics; the shared "Note 0 on" is below -sps
    one = run("-np 1 -c 4096", prompts=[DOC("rivers"), DOC("rivers") + " More?"], n_slots=1)
    assert [o.category for o in outcomes(one)] == [NEW, "slot hit"]
    assert set(HITS) >= {"slot hit", "RAM-cache hit"}
    data = png.to_png(heatmap_figure({"-np 2 -kvu": e, "-np 1": one}, labels=["a", "b", "c", "d"]))
    assert data.startswith(b"\x89PNG") and len(data) < png.MAX_BYTES


def test_a_label_is_shortened_to_its_bar_not_clipped_mid_word():
    """Issue 36: chapter 07's last RAM-cache entry read "#11 Chen (365" at the picture's edge."""
    from slotlab.figures.migration import _CHAR_IN, _fit

    label = "#11 Chen (365 tok)"
    assert _fit(label, len(label) * _CHAR_IN) == label
    assert _fit(label, 10 * _CHAR_IN) == "#11 Chen"  # the bar of the last column: the count goes, the name stays
    assert _fit(label, 4 * _CHAR_IN) == "#11…"
