"""The panel's conversations tab priced against a stable client (`Panel.show_stable`): chat calls sent
to a live engine on the real model through `slotlab.timeline.Conversations`, a clock at the top of the
system prompt; the tab draws a ◆ per call where a stable client's reuse ends and lists only advice a
run of the calls showed to save tokens."""

from __future__ import annotations

from slotlab.engine.scheduler import Engine
from slotlab.panel import Panel
from slotlab.timeline import Conversations

SYS = "You are the assistant of a bicycle workshop. " + " ".join(f"Rule {i}: be brief about part {i}." for i in range(12))


def test_show_stable_draws_what_a_stable_client_reuses_and_only_tested_advice(model):
    eng = Engine("-np 1 -c 4096", model=model)
    p = Panel(eng)
    conv = Conversations(eng)
    msgs = [{"role": "system", "content": "Time 10:00. " + SYS}, {"role": "user", "content": "My brakes squeal."}]
    for turn in range(3):
        t = conv.chat(msgs, n_predict=4)
        eng.run_until(lambda: t.done)
        msgs = [{"role": "system", "content": f"Time 10:0{turn + 1}. " + SYS}, *msgs[1:],
                {"role": "assistant", "content": t.result["content"]}, {"role": "user", "content": f"And part {turn}?"}]
    p.refresh()
    sw = p.show_stable(conv)
    st = sw.pricing
    assert [c.change for c in st.calls] == [None, "system_changed", "system_changed"]
    assert all(c.client > 100 for c in st.calls[1:])  # the clock cost what the server held
    assert st.calls[2].stable_reused > st.calls[2].reused
    marks = p.timeline.fig.data[-1]
    assert list(marks.x) == [c.stable_reused for c in st.calls] and len(marks.y) == 3
    text = p.timeline.advice.value
    assert "keep the system prompt byte-stable" in text and "untested" not in text
    for t in sw.advice.flags:
        assert (f"advice (server): {' '.join(t.flags)} —" in text) == (t.saved > 0 and not t.refuted)
    p.close()
    eng.close()
