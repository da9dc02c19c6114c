"""The client's side of a lost prefix (slotlab.conversation, issue 23 item 1).

The golden sessions were recorded from the real llama-server's chat endpoint (tests/golden/record_sessions.py):
one conversation per kind of client change, on the default model: `chatml`, its own rendering (the GGUF
has no template: the server's ChatML); `gemma2`, the Gemma format (the server folds the system prompt into
the first user turn); `qwen25`, a tools-capable template (tools rendered in the system block). The server ran with one slot and --swa-full, so its `cache_n` is exactly the common prefix of
what it held and the new prompt: slotlab's rendering must give the server's prompt length on every call,
and its divergence position the server's `cache_n` on every call that changed something."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from slotlab.conversation import Call, classify, marked
from slotlab.sim.traces import TraceError, load_sim_trace

SESSIONS = Path(__file__).resolve().parents[1] / "golden" / "sessions"
CONFIGS = sorted(p.name.removesuffix(".llama-server.json") for p in SESSIONS.glob("*.llama-server.json"))

S, U, A = ({"role": r, "content": c} for r, c in (("system", "sys"), ("user", "u0"), ("assistant", "a0")))


def _c(msgs, reply=None, tools=None):
    return Call(0, msgs, tools, reply)


def u(t):
    return {"role": "user", "content": t}


@pytest.mark.parametrize("prev,cur,want", [
    (_c([S, U], A), _c([S, U, A, u("u1")]), None),  # appends only
    (_c([S, U]), _c([S, U, A, u("u1")]), None),  # the reply not recorded: its echo is taken as it
    (_c([S, U], A), _c([S, U]), None),  # a retry
    (_c([S, U], A), _c([{"role": "system", "content": "sys 2"}, U, A, u("u1")]), ("system_changed", 0)),
    (_c([U], A), _c([S, U, A, u("u1")]), ("system_changed", 0)),  # a system prompt added
    (_c([S, U], A, tools=[{"type": "function", "function": {"name": "f"}}]), _c([S, U, A, u("u1")]),
     ("tools_changed", 0)),
    (_c([S, U, A, u("u1")], A), _c([S, u("u0!"), A, u("u1"), A, u("u2")]), ("message_edited", 1)),
    (_c([S, U, A, u("u1")], A), _c([S, U, A, u("note"), u("u1"), A, u("u2")]), ("message_inserted", 3)),
    # where turns must alternate (Gemma), a note comes with its answer: two messages inserted
    (_c([S, U, A, u("u1")], A), _c([S, U, A, u("note"), A, u("u1"), A, u("u2")]), ("message_inserted", 3)),
    (_c([S, U, A, u("u1"), A, u("u2")], A), _c([S, u("summary"), u("u3")]), ("compacted", 1)),
    (_c([S, U, A, u("u1"), A, u("u2")], A), _c([S, u("u2"), A, u("u3")]), ("compacted", 1)),
    (_c([S, U], A), _c([S, U, {"role": "assistant", "content": "a0 edited"}, u("u1")]), ("reply_not_echoed", 2)),
    (_c([S, U, A, u("u1")], A), _c([S, U]), ("other", 1)),  # a branch back
])
def test_classify(prev, cur, want):
    got = classify(prev, cur)
    assert (got[:2] if got else None) == want, got


def test_marked_shows_the_differing_part():
    b, a = marked("The time is 09:14:05. Rule 0: be brief.", "The time is 09:15:41. Rule 0: be brief.")
    assert b == "The time is 09:1[4:05]. Rule 0: be…" and a == "The time is 09:1[5:41]. Rule 0: be…"


# ---------------------------------------------------------------------------------------------- bad input

def _line(**kw):
    d = {"session_id": "s", "messages": [{"role": "user", "content": "hi"}], "output_length": 4, "gap": 0}
    d.update(kw)
    return json.dumps(d)


@pytest.mark.parametrize("bad, field", [
    (_line(tools={"name": "f"}), "tools"),
    (_line(tools=[{"type": "function"}]), "tools[0].function"),
    (_line(tools=[{"type": "function", "function": {"description": "d"}}]), "tools[0].function.name"),
    (_line(tools=["search_docs"]), "tools[0]"),
    (_line(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools[0].type"),
    (_line(tools=[{"type": "function", "function": {"name": "f", "parameters": "any"}}]),
     "tools[0].function.parameters"),
    (_line(messages=[{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}]),
     "messages[0].tool_calls[0].function.name"),
    (_line(messages=[{"role": "user", "content": "x", "tool_calls": []}]), "messages[0].tool_calls"),
    (_line(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
    (_line(messages="hi"), "messages"),
    (_line(reply={"role": "user", "content": "x"}), "reply.role"),
    (_line(reply=7), "reply"),
])
def test_a_malformed_tools_or_messages_field_names_line_and_field(tmp_path, bad, field):
    p = tmp_path / "log.jsonl"
    p.write_text(_line() + "\n" + bad + "\n")
    with pytest.raises(TraceError) as ei:
        load_sim_trace(p)  # every line is checked before a model is loaded
    msg = str(ei.value)
    assert str(p) in msg and "line 2" in msg and f"field '{field}'" in msg, msg


# ---------------------------------------------------------------------------------------------- golden sessions

def _golden(name):
    lines = [json.loads(x) for x in (SESSIONS / f"{name}.jsonl").read_text().splitlines() if x.strip()]
    rec = json.loads((SESSIONS / f"{name}.llama-server.json").read_text())
    return lines, rec


def _renderer(flags, model):
    from slotlab.conversation import Renderer
    from slotlab.engine.params import ServerParams

    root = Path(__file__).resolve().parents[2]
    flags = [str(root / f) if f.endswith(".jinja") else f for f in flags]
    return Renderer(model, ServerParams.from_args(flags))


@pytest.mark.parametrize("name", CONFIGS)
def test_golden_sessions_name_each_change(model, name):
    from slotlab.conversation import client_changes, held_tokens, lcp

    lines, rec = _golden(name)
    r = _renderer(rec["flags"], model)
    calls = [Call(i, x["messages"], x.get("tools"), x.get("reply"), None, x["session_id"]) for i, x in enumerate(lines)]
    # slotlab renders every call as the server did: the server's prompt length, call by call
    for c, srv in zip(calls, rec["calls"]):
        assert len(r.tokens(c.messages, c.tools)) == srv["cache_n"] + srv["prompt_n"], (name, c.request)
    changes = {c.request: c for c in client_changes(calls, r)}
    made = {i: tuple(s["made"]) for i, s in enumerate(rec["calls"]) if s["made"]}
    assert {i: (c.change, c.message) for i, c in changes.items()} == made
    kinds = {k for k, _ in made.values()}
    assert kinds == {"system_changed", "tools_changed", "message_edited", "message_inserted", "compacted",
                     "reply_not_echoed", "other"}
    prev = {}
    for i, c in enumerate(calls):
        j = prev.get(c.session)
        prev[c.session] = i
        if i not in changes or j is None:
            continue
        ch, srv = changes[i], rec["calls"][i]
        d = lcp(r.tokens(c.messages, c.tools), held_tokens(r, calls[j]))
        # the divergence is where the server stopped reusing (one slot, --swa-full: it cuts back anywhere),
        # exactly where it lies in the previous prompt; past it, in the reply, slotlab re-tokenizes the reply's
        # text, which can split a token differently from the ids the model generated (one token at most here)
        n_cur = len(r.tokens(c.messages, c.tools))
        assert ch.position == d, (name, i)
        if d <= len(r.tokens(calls[j].messages, calls[j].tools)):
            assert srv["cache_n"] == min(d, n_cur - 1), (name, i, d, srv["cache_n"])
        else:
            assert 0 <= min(d, n_cur - 1) - srv["cache_n"] <= 1, (name, i, d, srv["cache_n"])
        # what the change cost never exceeds what the server processed again
        assert 0 <= ch.tokens_lost <= srv["prompt_n"], (name, i)
        # a change early in the prompt makes the server process again what followed it (a reply shortened at
        # its end, as here, leaves nothing of what the server held after the divergence: 0 is right)
        if ch.change in ("system_changed", "message_edited", "message_inserted", "compacted"):
            assert ch.tokens_lost > 0, (name, i, ch.line())
        if ch.change == "tools_changed":
            # ChatML and Gemma render no tools (the prompt did not change: nothing lost); Qwen2.5 renders
            # them in its system block, so re-ordering them costs what followed
            renders_tools = not np.array_equal(r.tokens(c.messages, c.tools), r.tokens(c.messages, None))
            assert (ch.tokens_lost > 0) == renders_tools, (name, i, ch.line())
    plain = [i for i, x in enumerate(lines) if x["session_id"] == "plain"]
    assert plain and not any(i in changes for i in plain)


@pytest.mark.parametrize("name", CONFIGS)
def test_golden_sessions_through_simulate_why(model, name):
    """The same session log read by `simulate --why`: the sessions, the changes, as JSON."""
    import subprocess
    import sys

    _, rec = _golden(name)
    root = Path(__file__).resolve().parents[2]
    template = [str(root / f) if f.endswith(".jinja") else f for f in rec["flags"] if f in ("--jinja",)
                or f.endswith(".jinja") or f == "--chat-template-file"]
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "simulate", str(SESSIONS / f"{name}.jsonl"), "--why",
                          "--json", "-np", "1", "-c", "8192", *template], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    made = {i: tuple(s["made"]) for i, s in enumerate(rec["calls"]) if s["made"]}
    got = {c["request"]: (c["change"], c["message"]) for c in doc["client_changes"]}
    assert got == made
    assert all(set(c) == {"request", "session", "change", "message", "role", "tokens_lost", "before", "after",
                          "previous", "position", "stable", "stable_why"}
               for c in doc["client_changes"])
