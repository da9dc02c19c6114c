"""The calls a stable client would have sent (slotlab.why.stable.stable_calls), kind by kind, on
messages alone: the same new turn appended to what the server held for the conversation."""

from __future__ import annotations

from slotlab.conversation import Call, classify
from slotlab.why.stable import stable_calls


def u(t):
    return {"role": "user", "content": t}


def a(t):
    return {"role": "assistant", "content": t}


def s(t):
    return {"role": "system", "content": t}


def _pair(prev_msgs, reply, cur_msgs, **kw):
    calls = [Call(0, prev_msgs, kw.get("tools0"), a(reply)), Call(1, cur_msgs, kw.get("tools1"), a("r1"))]
    return calls, stable_calls(calls, parent=[None, 0])


def test_system_changed_and_edited_keep_the_held_history():
    calls, st = _pair([s("t=1 sys"), u("q1")], "a1", [s("t=2 sys"), u("q1"), a("a1"), u("q2")])
    assert classify(*calls)[0] == "system_changed"
    assert st[1].undone and st[1].messages == [s("t=1 sys"), u("q1"), a("a1"), u("q2")]
    calls, st = _pair([s("sys"), u("q1"), a("a1"), u("q2")], "a2", [s("sys"), u("Q1!"), a("a1"), u("q2"), a("a2"), u("q3")])
    assert classify(*calls)[:2] == ("message_edited", 1)
    assert st[1].messages == [s("sys"), u("q1"), a("a1"), u("q2"), a("a2"), u("q3")]


def test_reply_inserted_compacted_tools():
    calls, st = _pair([u("q1")], "a1 as generated", [u("q1"), a("my own"), u("q2")])
    assert classify(*calls)[0] == "reply_not_echoed" and st[1].messages == [u("q1"), a("a1 as generated"), u("q2")]
    calls, st = _pair([u("q1"), a("a1"), u("q2")], "a2", [u("q1"), a("a1"), u("note"), a("noted"), u("q2"), a("a2"),
                                                          u("q3")])
    assert classify(*calls)[0] == "message_inserted"
    assert st[1].messages == [u("q1"), a("a1"), u("q2"), a("a2"), u("note"), a("noted"), u("q3")]
    calls, st = _pair([s("sys"), u("q1"), a("a1"), u("q2")], "a2", [s("sys"), u("summary"), a("ok"), u("q3")])
    assert classify(*calls)[0] == "compacted"
    assert st[1].messages == [s("sys"), u("q1"), a("a1"), u("q2"), a("a2"), u("q3")]
    t0 = [{"type": "function", "function": {"name": "grep"}}]
    t1 = t0 + [{"type": "function", "function": {"name": "run"}}]
    calls, st = _pair([u("q1")], "a1", [u("q1"), a("a1"), u("q2")], tools0=t0, tools1=t1)
    assert classify(*calls)[0] == "tools_changed" and st[1].tools == t0 and st[1].undone


def test_later_calls_build_on_the_stable_history_and_kinds_not_undone_are_kept():
    c = [Call(0, [s("t=1"), u("q1")], None, a("a1")),
         Call(1, [s("t=2"), u("q1"), a("a1"), u("q2")], None, a("a2")),
         Call(2, [s("t=2"), u("q1"), a("a1"), u("q2"), a("a2"), u("q3")], None, a("a3"))]
    st = stable_calls(c, parent=[None, 0, 1])
    assert st[2].differs and not st[2].undone and st[2].change is None
    assert st[2].messages[0] == s("t=1") and st[2].messages[-1] == u("q3")
    kept = stable_calls(c, parent=[None, 0, 1], undo=("message_edited",))
    assert [x.messages for x in kept] == [x.messages for x in c] and kept[1].change == "system_changed"
