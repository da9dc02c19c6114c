"""Conversations told by content (slotlab.identity): every kind of client rewrite stays in its
conversation, conversations that share a system prompt stay apart, the client's own ids win."""

from __future__ import annotations

from slotlab.conversation import Call
from slotlab.identity import names, near, parents

SYS = "You are a coding agent. " * 40


def u(t):
    return {"role": "user", "content": t}


def a(t):
    return {"role": "assistant", "content": t}


def sys_(t=SYS):
    return {"role": "system", "content": t}


def test_rewrites_stay_in_their_conversation_and_two_chats_with_one_system_prompt_stay_apart():
    calls = []

    def add(msgs, reply, **kw):
        calls.append(Call(len(calls), msgs, None, a(reply), **kw))

    # clock (system changes every turn), edit (first message rewritten), plain: interleaved, one system prompt
    add([sys_("Time 10:00\n" + SYS), u("list the dir")], "ok1")                       # 0 clock
    add([sys_(), u("open setup.py")], "ok2")                                           # 1 edit
    add([sys_(), u("what is 2+2")], "4")                                               # 2 plain
    add([sys_("Time 10:01\n" + SYS), u("list the dir"), a("ok1"), u("and grep")], "g")  # 3 clock
    add([sys_(), u("open pyproject.toml"), a("ok2"), u("run tests")], "t")               # 4 edit (edited)
    add([sys_(), u("what is 2+2"), a("4"), u("and 3+3")], "6")                          # 5 plain
    # compaction: history replaced by a summary, the last turn kept
    add([sys_(), u("summary: 2+2 is 4"), a("ok"), u("what is 2+2"), a("4"), u("and 3+3"), a("6"), u("and 4+4")], "8")
    p = parents(calls)
    assert p[:3] == [None, None, None]  # the same system prompt, no message in common: three conversations
    assert p[3] == 0 and p[4] == 1 and p[5] == 2 and p[6] == 5
    assert names(calls) == ["#0", "#1", "#2", "#0", "#1", "#2", "#2"]


def test_tool_call_ids_pair_a_replaced_reply_and_user_fields_keep_users_apart():
    tc = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "grep", "arguments": "{\"p\": \"x\"}"}}]}
    calls = [Call(0, [sys_(), u("find x")], None, a("let me look")),
             Call(1, [sys_(), u("find x")], None, a("other user"), user="bob"),
             # the client sends its own tool call instead of the reply, then the result
             Call(2, [sys_(), u("find x"), tc, {"role": "tool", "tool_call_id": "call_7", "content": "a.py"}], None,
                  a("found")),
             Call(3, [sys_(), u("find x"), tc, {"role": "tool", "tool_call_id": "call_7", "content": "a.py"},
                      a("found"), u("thanks")], None, a("np"))]
    p = parents(calls)
    assert p[2] == 1 and p[3] == 2  # the latest call sharing its messages (user bob's: no user on #2)
    calls[2].user = calls[3].user = "ann"
    calls[0].user = "ann"
    assert parents(calls)[2] == 0  # ann's calls never pair with bob's


def test_a_client_session_id_wins_over_content():
    calls = [Call(0, [u("hi")], None, a("yo"), session="s1"), Call(1, [u("hi")], None, a("yo"), session="s2"),
             Call(2, [u("hi"), a("yo"), u("more")], None, a("k"), session="s1")]
    assert parents(calls) == [None, None, 0]
    assert names(calls) == ["s1", "s2", "s1"]


def test_near_system_prompts():
    assert near("Time 10:00\n" + SYS, "Time 10:01\n" + SYS)
    assert not near("You review pull requests.", "You answer build questions.")


def test_a_side_request_quoting_one_message_starts_its_own_conversation():
    first = u("fix the failing test in tests/test_cli.py")
    calls = [Call(0, [sys_(), first], None, a("on it")),
             Call(1, [sys_("Write a 5-word title for this conversation."), first], None, a("Fix failing CLI test")),
             Call(2, [sys_(), first, a("on it"), u("go on")], None, a("done"))]
    assert parents(calls) == [None, None, 0]
