"""Record chat sessions, one for each kind of client change, from the real llama-server's chat endpoint.

    python -m tests.golden.record_sessions [NAME...]   -> tests/golden/sessions/NAME.jsonl + NAME.llama-server.json

Each session is a conversation of a few `/v1/chat/completions` calls (greedy, a few tokens each) in
which the client makes one kind of change (slotlab.conversation.KINDS) on one call, or none (`plain`).
The server renders the messages with its own chat template; what it reused and processed comes from its
answers' `timings` (`cache_n`, `prompt_n`). The session log (the format `slotlab simulate` reads, with
`tools` and each call's `reply` as the server generated it) is what the client sent; the `.llama-server.json`
holds, per call, the server's figures and the change the recorder made (`made`: kind, message index).

The server runs with `-np 1 --swa-full`: one slot, and a memory that can be cut back anywhere, so the
server reuses exactly the common prefix of what it held (the previous prompt and the reply it generated)
and the new prompt — its `cache_n` is then the divergence position itself, which the test compares with
slotlab's. Templates (NAME):

* `chatml`: the default model's own rendering (its GGUF has no template: the server's ChatML);
* `qwen25`: a tools-capable template (Qwen2.5-Instruct: tools rendered in the system block);
* `gemma2`: the Gemma chat format (Gemma 2's template: the Gemma 3 GGUF here carries none, and none of
  Gemma 3's ships with llama.cpp's templates): no system role, so the server folds the system prompt into
  the first user turn; turns must alternate, so an inserted note and a compaction's summary come with an
  assistant answer. Not recorded yet (the shared host ran these at about 1 call a minute): record them
  with `python -m tests.golden.record_sessions qwen25 gemma2`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

DIR = Path(__file__).with_name("sessions")
TEMPLATES = Path(__file__).resolve().parents[1] / "llamacpp" / "vendor" / "models" / "templates"
CONFIGS = {
    "chatml": [],
    "qwen25": ["--jinja", "--chat-template-file", str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja")],
    "gemma2": ["--jinja", "--chat-template-file", str(TEMPLATES / "google-gemma-2-2b-it.jinja")],
}
FLAGS = ["-np", "1", "-c", "8192", "--swa-full"]
MAX_TOKENS = 3  # a few tokens: the replies are data the next call echoes, not the subject

TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "description": "what to look up"}}, "required": ["q"]}}}
    for n, d in (("search_docs", "Search the shop's manuals"), ("stock_level", "Units in stock for a part"),
                 ("order_part", "Order a part for a customer"))]


def system(tag: str, extra: str = "") -> dict:
    """A system prompt unique to the session (no RAM-cache entry of another session matches it)."""
    return {"role": "system", "content": f"Session {tag}. You are the assistant of a bicycle workshop.{extra} "
            + " ".join(f"Rule {i}: answer about part {i} in one short sentence." for i in range(12))}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


Q = ["My rear brake squeals when it rains.", "Should I replace the pads or clean the rim?",
     "How long does a pad change take?", "Do you have pads for a 2019 city bike?"]


def session_plain(ask):
    m = [system("plain"), user(Q[0])]
    for q in Q[1:]:
        m += [ask(m), user(q)]
    ask(m)


def session_system_changed(ask):
    base = [user(Q[0])]
    r = ask([system("clock", " The time is 09:14:05."), *base])
    ask([system("clock", " The time is 09:15:41."), *base, r, user(Q[1])], made=("system_changed", 0))


def session_tools_changed(ask):
    m = [system("tools"), user(Q[0])]
    r = ask(m, tools=TOOLS)
    ask([*m, r, user(Q[1])], tools=[TOOLS[1], TOOLS[0], TOOLS[2]], made=("tools_changed", 0))


def session_message_edited(ask):
    m = [system("edit"), user(Q[0])]
    r1 = ask(m)
    m2 = [*m, r1, user(Q[1])]
    r2 = ask(m2)
    edited = [m[0], user(Q[0].replace("rear", "front")), r1, user(Q[1]), r2, user(Q[2])]
    ask(edited, made=("message_edited", 1))


def session_message_inserted(ask, alternating=False):
    m = [system("insert"), user(Q[0])]
    r1 = ask(m)
    m2 = [*m, r1, user(Q[1])]
    r2 = ask(m2)
    note = [user("Note: the bike is a 2019 city bike.")]
    if alternating:  # the template wants user / assistant turns in turn: a note and its answer
        note.append({"role": "assistant", "content": "Noted."})
    ask([m[0], m[1], r1, *note, user(Q[1]), r2, user(Q[2])], made=("message_inserted", 3))


def session_compacted(ask, alternating=False):
    m = [system("compact"), user(Q[0])]
    for q in Q[1:3]:
        m += [ask(m), user(q)]
    r = ask(m)
    summary = [user("Summary of the conversation so far: the customer's rear brake squeals in the rain; "
                    "pads or rim cleaning were discussed.")]
    if alternating:
        summary.append({"role": "assistant", "content": "Understood."})
    ask([m[0], *summary, user(Q[3])], made=("compacted", 1))
    del r


def session_reply_not_echoed(ask):
    m = [system("echo"), user(Q[0])]
    r = ask(m)
    stripped = {"role": "assistant", "content": (r.get("content") or "")[: max(1, len(r.get("content") or "") // 2)]
                + " (shortened by the client)"}
    ask([*m, stripped, user(Q[1])], made=("reply_not_echoed", 2))


def session_other(ask):
    m = [system("branch"), user(Q[0])]
    r1 = ask(m)
    m2 = [*m, r1, user(Q[1])]
    ask(m2)
    ask(m, made=("other", 1))  # a branch back: the client re-sends the first call's messages (a regenerate)


SESSIONS = {k.removeprefix("session_"): v for k, v in globals().items() if k.startswith("session_")}
#: templates that raise unless user and assistant turns alternate (Gemma): the insertion and the compaction
#: add an assistant turn after their user message
ALTERNATING = {"gemma2"}


def record(name: str) -> None:
    DIR.mkdir(exist_ok=True)
    lines, calls = [], []
    with LlamaServer(default_model_path(), [*FLAGS, *CONFIGS[name]]) as srv:
        for sid, fn in SESSIONS.items():
            def ask(messages, tools=None, made=None, sid=sid):
                body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
                if tools:
                    body["tools"] = tools
                st, ans = srv.post("/v1/chat/completions", body)
                if st != 200:
                    raise RuntimeError(f"{name}/{sid}: {st} {ans}")
                msg = ans["choices"][0]["message"]
                reply = {k: msg[k] for k in ("role", "content", "reasoning_content", "tool_calls") if msg.get(k)}
                reply.setdefault("content", "")
                t = ans["timings"]
                # copies: a session goes on appending to its list (the line is what was sent then)
                line = {"session_id": sid, "gap": 1.0, "messages": json.loads(json.dumps(messages)), "reply": reply}
                if tools:
                    line["tools"] = json.loads(json.dumps(tools))
                lines.append(line)
                calls.append({"session_id": sid, "cache_n": t["cache_n"], "prompt_n": t["prompt_n"],
                              "usage": ans.get("usage"), "made": list(made) if made else None})
                return dict(reply)  # a plain client echoes the reply as it got it

            if name in ALTERNATING and "alternating" in fn.__code__.co_varnames:
                fn(ask, alternating=True)
            else:
                fn(ask)
    (DIR / f"{name}.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    (DIR / f"{name}.llama-server.json").write_text(json.dumps(
        {"flags": [*FLAGS, *[f if not f.endswith(".jinja") else f"tests/llamacpp/vendor/models/templates/{Path(f).name}"
                             for f in CONFIGS[name]]], "max_tokens": MAX_TOKENS, "calls": calls}, indent=1) + "\n")
    print(f"{name}: {len(lines)} calls")


def main(argv: list[str]) -> int:
    for name in argv or list(CONFIGS):
        record(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
