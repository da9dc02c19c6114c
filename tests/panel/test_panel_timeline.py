"""The panel's conversations tab and why line over a real engine in step mode, chat calls sent through
slotlab.timeline.Conversations: the timeline grows call by call as requests finish, its bars are the
engine's own cache_n / prompt_n, the client's change is coloured and named in the why line, and no
flag is offered that nothing confirmed (a live panel tests none: its lines say how to)."""

import re

import pytest

from slotlab.engine.scheduler import Engine
from slotlab.panel import Panel
from slotlab.panel.timeline import PARTS, row_name
from slotlab.timeline import Conversations

SYS = ("You are the assistant of a bicycle workshop. Answer in one short sentence. Rule 0: be kind. "
       "Rule 1: be exact. Rule 2: name the part.")


def _bars(p):
    """The plotted bars: part -> [(row, base, tokens)]."""
    return {part: list(zip(tr.y, tr.base, tr.x)) for part, tr in zip(PARTS, p.timeline.fig.data)}


@pytest.fixture(scope="module")
def run(model):
    e = Engine(["-np", "1", "-c", "4096"], model=model)  # Gemma 3 is an SWA model: checkpoint misses show too
    p = Panel(e)
    conv = Conversations(e)
    msgs = [{"role": "system", "content": SYS}, {"role": "user", "content": "My rear brake squeals."}]
    rows_seen = []
    tasks = []

    def send(messages):
        t = conv.chat(messages, session="agent", n_predict=4)
        p.refresh()
        queued = list(p.timeline.fig.layout.yaxis.categoryarray)  # a call is drawn once it is done
        while e.step():
            pass
        p.refresh()
        assert t.done
        tasks.append(t)
        rows_seen.append((queued, list(p.timeline.fig.layout.yaxis.categoryarray)))
        return t

    t0 = send(msgs)
    reply = {"role": "assistant", "content": t0.result["content"]}
    t1 = send([*msgs, reply, {"role": "user", "content": "Should I clean the rim?"}])  # appends only
    r1 = {"role": "assistant", "content": t1.result["content"]}
    clock = [{"role": "system", "content": SYS.replace("workshop.", "workshop. The time is 09:15.")}]
    send([*clock, *msgs[1:], reply, {"role": "user", "content": "Should I clean the rim?"}, r1,
          {"role": "user", "content": "How long does it take?"}])  # a clock in the system prompt
    yield e, p, conv, tasks, rows_seen
    p.close()
    e.close()


def test_the_timeline_grows_as_calls_finish_and_equals_the_engine(run):
    e, p, conv, tasks, rows_seen = run
    # one more row after each call, in call order, top to bottom
    assert [rows for _, rows in rows_seen] == [["agent · #0"], ["agent · #1", "agent · #0"],
                                               ["agent · #2", "agent · #1", "agent · #0"]]
    assert [q for q, _ in rows_seen] == [[], ["agent · #0"], ["agent · #1", "agent · #0"]]
    bars = p.state.timeline.bars()
    assert [b.request for b in bars] == [0, 1, 2]
    for b, t in zip(bars, tasks):  # the bars are the engine's own numbers
        assert (b.cache_n, b.prompt_n) == (t.result["timings"]["cache_n"], t.result["timings"]["prompt_n"])
        assert sum(n for _, n in b.parts) == b.prompt_n
    plotted = _bars(p)
    for b in bars:
        segs = sorted((base, n, part) for part, xs in plotted.items() for y, base, n in xs if y == row_name(b))
        assert segs[0] == (0, b.cache_n, "reused") or b.cache_n == 0
        assert sum(n for _, n, part in segs if part != "reused") == b.prompt_n
        assert all(a + n == c for (a, n, _), (c, _, _) in zip(segs, segs[1:]))  # contiguous, no overlap
    # the first call is new; the second only appended; the third changed the system prompt
    assert bars[0].call.change is None and bars[1].call.change is None
    c = bars[2].call
    assert c.change == "system_changed" and c.message_index == 0 and c.tokens_lost > 0
    assert ("client:system_changed", min(c.tokens_lost, bars[2].prompt_n)) in bars[2].parts
    assert any(part == "client:system_changed" for part, xs in plotted.items() if xs)
    mk = p.timeline.fig.data[len(PARTS)]
    assert list(mk.y) == ["agent · #2"] and list(mk.x) == [min(c.position, bars[2].cache_n + bars[2].prompt_n)]
    # the server side too: Gemma without --swa-full restores a checkpoint before the appended turn
    assert bars[1].miss is not None and ("server:" + bars[1].miss.cause, bars[1].miss.lost) in bars[1].parts


def test_the_why_line_names_the_client_change_and_no_unconfirmed_flag(run):
    e, p, conv, tasks, _ = run
    why = {t: line for t, _, line in p.state.why}
    line = why[tasks[2].id]
    assert "CLIENT CHANGE system_changed at message 0 (system)" in line
    assert "[" in line and "09:15" in line  # the differing text, shortened, the change marked
    assert re.search(r"(\d+) tokens the server held processed again", line).group(1) == \
        str(p.state.timeline.bars()[2].call.tokens_lost)
    assert "keep the system prompt byte-stable" in line
    # nothing replayed a counterfactual here: no flag is shown (only how to test them), and the
    # client's part of the line names no flag at all
    from slotlab.explain import NOT_TESTED

    for ln in why.values():
        assert not re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", ln.replace(NOT_TESTED, "")), ln
    assert "--" not in line.split("CLIENT CHANGE")[1]
    assert "CLIENT CHANGE" not in why[tasks[1].id]
    assert p.why_box.value.count("CLIENT CHANGE") == 1


def test_a_rebuilt_state_draws_the_same_timeline(run):
    """The slider's rebuild (PanelState.from_bus) folds the client_call events like the live panel."""
    from slotlab.panel.state import PanelState
    from slotlab.panel.timeline import timeline_data

    e, p, *_ = run
    again = PanelState.from_bus(e.events)
    assert timeline_data(again.timeline) == timeline_data(p.state.timeline)
    assert [w for w in again.why] == [w for w in p.state.why]


def test_a_trimmed_bus_keeps_the_last_calls_of_the_timeline():
    """Long runs: the bus trims its log, but retains the last TIMELINE_KEEP client_call and task_done
    events, so a timeline rebuilt late (a panel opened late, the slider) equals the one folded live."""
    from slotlab.engine import event_types as T
    from slotlab.engine.events import EventBus
    from slotlab.panel.timeline import timeline_data
    from slotlab.timeline import Timeline

    bus = EventBus(max_log=50)
    live = Timeline()
    bus.subscribe(live.apply)
    bus.emit(T.Init(n_slots=1, n_ctx_slot=4096, kv_unified=True, n_swa=0, cache_ram=0, flags=["-np", "1"],
                    draft=False, sps=0.1))
    for i in range(3 * T.TIMELINE_KEEP):
        change = {"change": "system_changed", "message_index": 0, "role": "system", "tokens_lost": 7, "before": "a",
                  "after": "b", "previous": i - 3, "position": 3} if i % 5 == 4 else {}
        bus.emit(T.ClientCall(request=i, session=f"s{i % 3}", **change), task=i)
        bus.emit(T.TaskDone(cache_n=i % 11, prompt_n=20, predicted_n=1, tokens_cached=30), slot=0, task=i)
    late = Timeline().fold(bus.replayable())
    assert len(live.bars()) == len(late.bars()) == T.TIMELINE_KEEP
    assert timeline_data(late) == timeline_data(live)
    b = late.bars()[-1]
    assert (b.request, b.cache_n, b.prompt_n, b.parts) == (599, 599 % 11, 20, [("client:system_changed", 7),
                                                                               ("new", 13)])
