"""The panel shows each miss's cause: the why line of the request and PanelState.misses (headless,
on the fake memory; the browser test renders the same state)."""

from slotlab import explain
from slotlab.engine.scheduler import Engine
from slotlab.memory.fake import FakeMemory
from slotlab.panel.state import PanelState

SYS = "You are the support assistant of a bicycle shop. Policies: be kind, be brief, be exact. " * 2


def test_the_why_line_carries_the_cause_and_no_untested_flag():
    e = Engine("-np 1 -c 4096 --cache-ram 0 --ctx-checkpoints 0", memory=FakeMemory(n_slots=1, n_swa=512),
               observers=[explain.attach])
    for p in (SYS + "user: my brakes squeal", SYS + "user: my brakes squeal. assistant: ok. user: and the chain?"):
        t = e.submit(p, n_predict=4)
        e.run_until(lambda: t.done)
    st = PanelState.from_bus(e.events)
    task, slot, line = st.why[-1]
    # a live panel has no trace to replay: no flag is offered, the line says how to test them
    assert task == 1 and "MISSED" in line and "no checkpoint was at or before it" in line
    from slotlab.explain import NOT_TESTED

    assert f"({NOT_TESTED})" in line and "--swa-full" not in line and "--ctx-checkpoints" not in line
    assert [m.cause for m in st.misses] == ["no_checkpoint"] and st.slots[0].why == line
    ev = [x for x in e.events.log if x.kind == "request_miss"]  # the cause as data, in the event log
    assert len(ev) == 1 and ev[0].task == 1 and ev[0].payload.cause == "no_checkpoint" and "--swa-full" in ev[0].payload.suggest
    assert ev[0].seq == next(x.seq for x in e.events.log if x.kind == "prompt_plan" and x.task == 1) + 1


def test_a_live_subscriber_sees_events_in_seq_order_with_derived_ones():
    """request_miss is emitted from inside the delivery of prompt_plan: the bus must still deliver
    prompt_plan to every subscriber before it (a panel drops events older than the last it applied)."""
    e = Engine("-np 1 -c 4096 --cache-ram 0 --ctx-checkpoints 0", memory=FakeMemory(n_slots=1, n_swa=512),
               observers=[explain.attach])
    seen = []
    e.events.subscribe(lambda ev: seen.append(ev.seq))
    for p in (SYS + "user: a", SYS + "user: a. assistant: b. user: c"):
        t = e.submit(p, n_predict=4)
        e.run_until(lambda: t.done)
    assert seen == sorted(seen) == [ev.seq for ev in e.events.log if ev.seq >= seen[0]]
    assert any(ev.kind == "request_miss" for ev in e.events.log)


def _two_turns(e):
    for p in (SYS + "user: a", SYS + "user: a. assistant: b. user: c"):
        t = e.submit(p, n_predict=4)
        e.run_until(lambda: t.done)


def test_the_engine_attaches_no_explainer_and_a_late_attach_folds_the_history_silently():
    """The engine imports no view: without an observer no request_miss is emitted. Attached after the
    fact (a panel opened on a running engine), the explainer knows the history's misses but emits
    only the ones that follow; attaching twice is the same explainer (no miss emitted twice)."""
    e = Engine("-np 1 -c 4096 --cache-ram 0 --ctx-checkpoints 0", memory=FakeMemory(n_slots=1, n_swa=512))
    _two_turns(e)
    assert not any(ev.kind == "request_miss" for ev in e.events.log)
    x = explain.attach(e.events)
    assert explain.attach(e.events) is x and [m.task for m in x.misses] == [1]
    assert not any(ev.kind == "request_miss" for ev in e.events.log)  # the history's miss: not re-emitted
    _two_turns(e)
    emitted = [ev.task for ev in e.events.log if ev.kind == "request_miss"]
    assert emitted == [m.task for m in list(x.misses)[1:]] and len(emitted) >= 1
