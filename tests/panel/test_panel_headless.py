"""The panel over a real engine in step mode, no browser: the widget state equals the engine's numbers."""

import dataclasses

import pytest

from slotlab.engine.scheduler import Engine
from slotlab.panel import Panel, PanelState
from slotlab.panel.state import PROVENANCE

A = "Tell me about the rivers of Europe, their sources and their deltas"
B = "A completely unrelated question about the anatomy of house cats"


def _summary(st: PanelState) -> dict:
    return {"slots": {i: dataclasses.asdict(s) for i, s in st.slots.items()}, "entries": dict(st.entries),
            "gauge": dict(st.gauge), "scores": dict(st.scores), "why": list(st.why), "evictions": list(st.evictions),
            "history": {i: list(h) for i, h in st.history.items()}}


@pytest.fixture
def run(model):
    e = Engine(["-np", "2", "-kvu", "-c", "4096", "--swa-full", "-sps", "0", "--cache-ram", "64"], model=model)
    p = Panel(e)
    seen = {}
    for q in (A, B, A + " and in Asia?"):
        t = e.submit(q, n_predict=4)
        while e.step():
            p.refresh()
            seen[p.state.last_seq] = _summary(p.state)
        p.refresh()
        seen[p.state.last_seq] = _summary(p.state)
        assert t.done
    yield e, p, seen
    p.close()
    e.close()


def test_rows_and_provenance_equal_the_engine(run):
    e, p, _ = run
    st = p.state
    assert st.n_slots == 2 and set(st.slots) == {0, 1}
    last = [t for t in e.tasks.values() if t.done][-1]
    slot = e.slots[last.id_slot]
    sv = st.slots[slot.id]
    assert sv.n_tokens == len(slot.tokens) == last.result["tokens_cached"]
    kinds = {k: (a, b) for a, b, k in sv.prov}
    assert kinds["cache"] == (0, last.result["timings"]["cache_n"])  # restored from RAM entry, then LCP-kept
    assert kinds["prefill"][1] - kinds["prefill"][0] == last.result["timings"]["prompt_n"]
    assert kinds["generated"] == (last.result["tokens_evaluated"], len(slot.tokens))
    # the figure carries the same spans
    bars = {kind: list(zip(tr.base, tr.x, tr.y)) for kind, tr in zip(PROVENANCE, p.fig.data)}
    assert (0, kinds["cache"][1], f"slot {slot.id}") in bars["cache"]
    assert "RAM entry #" in sv.why and f"{last.result['timings']['cache_n']} tokens reused" in sv.why


def test_cache_table_equals_the_cache_with_scores(run):
    e, p, _ = run
    ids = [x.id for x in e.cache.entries]
    assert list(p.state.entries) == ids
    html = p.cache_box.value
    for x in e.cache.entries:
        assert f"#{x.id}" in html and f"<td>{x.n_tokens()}</td>" in html
    sc = p.state.scores
    assert sc["winner_id"] is not None and not sc["preview"]
    win = [s for s in sc["scores"] if s["winner"]][0]
    assert f"{win['f_keep']:.3f}" in e.events.filter(["cache_load_found"])[-1].message
    g = p.state.gauge
    assert g["size"] == e.cache.size() and g["n_tokens"] == e.cache.n_tokens()


def test_event_log_and_filters(run):
    e, p, _ = run
    assert "selected slot by LRU" in p.events_box.value
    p.f_kind.value = "cache_evict"
    p.f_text.value = False
    rows = p.events_box.value.count("<tr>") - 1
    assert rows == len(e.events.filter(["cache_evict"]))
    p.f_reason.value = "loaded"
    assert p.events_box.value.count("<tr>") - 1 == sum(1 for x in e.events.filter(["cache_evict"]) if x.payload.reason == "loaded") > 0
    assert [r for _, _, r, _, _ in p.state.evictions if r == "loaded"]


def test_scrubbing_back_reproduces_the_state(run):
    e, p, seen = run
    for seq in sorted(seen)[:: max(1, len(seen) // 12)]:
        assert _summary(p.show_at(seq)) == seen[seq]
    assert "scrubbing" in p.header.value
    p.follow.value = False
    p.follow.value = True
    assert p.live and p.state.last_seq == e.events.log[-1].seq


def test_attach_to_a_running_engine_rebuilds_from_the_log(run):
    e, p, _ = run
    q = Panel(e)
    assert _summary(q.state) == _summary(PanelState.rebuild(e.events.log)) == _summary(p.state)
    q.close()


def test_controls_send_step_and_report_errors(run):
    e, p, _ = run
    p.prompt.value = "One more question about deltas"
    p.n_predict.value = 2
    p.b_send.click()
    p.b_idle.click()
    assert p.state.n_requests == 4
    p.a_file.value = "../bad"
    p.b_save.click()  # no --slot-save-path: the server's 501 text, shown, no exception
    assert "does not support slots action" in p.status.value


def test_checkpoint_chain_and_marks(model):
    """Default flags (SWA): the panel shows the slot's checkpoints as spans and marks their creation."""
    e = Engine(["-np", "1", "-c", "2048"], model=model)
    p = Panel(e)
    t = e.submit(" ".join(f"Line {i} of the harbour log." for i in range(120)), n_predict=2)
    e.run_until_idle()
    p.refresh()
    ck = e.slots[0].checkpoints
    assert len(ck) == 2
    spans = p.fig.data[len(PROVENANCE) + 2]  # the checkpoint bars
    assert list(spans.base) == [c.pos_min for c in ck]
    marks = p.fig.data[len(PROVENANCE) + 4]
    assert sorted(marks.x) == sorted(c.n_tokens for c in ck) and "created" in marks.hovertext[0]
    assert t.result["tokens_evaluated"] - 4 in [c.n_tokens for c in ck]
    p.close()
    e.close()


def test_an_empty_slots_baseline_is_said_in_words_not_as_minus_one(run):
    """The server scores an empty slot f_keep -1 so any entry at the floor wins: the panel says so, and
    a slot's own baseline in figures."""
    import copy

    e, p, _ = run
    st = copy.copy(p.state)
    st.scores = dict(p.state.scores, f_keep_base=-1.0, f_sim_base=0.0)
    p._render_cache(st)
    assert "the slot is empty" in p.cache_box.value and "-1.000" not in p.cache_box.value
    st.scores = dict(p.state.scores, f_keep_base=0.5, f_sim_base=0.25)
    p._render_cache(st)
    assert "baseline f_keep 0.500, f_sim 0.250" in p.cache_box.value
    p._render_cache(p.state)
    assert p.fig.layout.margin.r >= 270  # room for the legend's longest label
