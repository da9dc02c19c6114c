"""A coding agent's session as the real SDKs send it, with every kind of client change the analysis
names (slotlab.conversation.KINDS), driven against any OpenAI / Anthropic-compatible base URL (a
`slotlab proxy` in front of llama-server or `slotlab serve`).

Six conversations, interleaved call by call, no session headers except where a real client sends one
(Claude Code's `metadata.user_id` carries its session):

* `clock` (openai chat): the current time at the top of a ~1,500-token system prompt of tool
  descriptions, so every turn after the first changes it 28 tokens in (`system_changed`, message 0);
* `edit` (openai chat, the same system prompt): the first user message edited at turn 3
  (`message_edited`, message 1);
* `tools` (openai chat with tools): the client sends back its own tool call and the tool's result in
  place of the model's reply at turns 2 and 3 (`reply_not_echoed`, message 2 and 4), appends plainly at
  turn 4, then sends one more tool (`tools_changed`) at turn 5;
* `notes` (anthropic, no system prompt, streamed turns): a note and its answer inserted before the
  last turn at turn 3 (`message_inserted`);
* `summary` (anthropic with a system prompt and Claude Code's metadata): history compacted into a
  summary at turn 4 (`compacted`);
* `responses` (OpenAI Responses API, streamed and not): plain turns, then its instructions changed
  at turn 3 (`system_changed`).

`drive(base_url)` runs it and returns one `Sent` a call, in the order sent: the ground truth (which
conversation, which change at which message) the analysis must find from the recording alone."""

from __future__ import annotations

from dataclasses import dataclass

MAX_TOKENS = 8

#: ~1,500 tokens of tool descriptions, the system prompt an agent sends on every call
TOOL_DOC = "You are a coding agent working in a git repository. You can use these tools.\n" + "\n".join(
    f"- {name}: {what}. Arguments: path (string), pattern (string, optional), limit (integer, default "
    f"{20 + 7 * i}). Returns the {what.split()[0].lower()} result as text; errors are returned as text too, never "
    f"raised. Use it when the user asks about {topic}."
    for i, (name, what, topic) in enumerate([
        ("read_file", "Read a file of the repository", "the contents of a file"),
        ("write_file", "Write a whole file", "changing a file"),
        ("list_dir", "List a directory", "which files exist"),
        ("grep", "Search files for a regular expression", "where something is used"),
        ("run_tests", "Run the test suite or one test", "whether the code works"),
        ("git_diff", "Show the uncommitted changes", "what changed"),
        ("git_log", "Show the recent commits", "the history"),
        ("apply_patch", "Apply a unified diff", "editing several places at once"),
        ("format_code", "Format a file with the project's formatter", "style"),
        ("build", "Build the project", "compile errors"),
        ("open_issue", "Read an issue of the tracker", "a bug report"),
        ("web_search", "Search the web", "documentation outside the repository"),
    ] * 3)) + "\nAlways answer briefly. Never invent file names."

TOOLS = [{"type": "function", "function": {
    "name": n, "description": d,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    for n, d in (("read_file", "Read a file"), ("grep", "Search the files"))]
MORE_TOOLS = TOOLS + [{"type": "function", "function": {
    "name": "run_tests", "description": "Run the tests",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


@dataclass
class Sent:
    """One call as the driver made it: its conversation, turn, and the change it made (None: appended)."""

    conversation: str
    turn: int
    api: str  # "chat", "anthropic", "responses"
    change: str | None = None
    message: int | None = None  # the message index of the change (OpenAI chat form, system prompt = 0)


def _clock(turn: int) -> str:
    return f"Current time: 2026-12-06 13:{10 + turn:02d}:{(17 * turn) % 60:02d} UTC\n"


class _Chat:
    """An OpenAI chat conversation: `messages`, with the model's replies appended as generated."""

    def __init__(self, client, name: str, system: str, tools=None):
        self.client, self.name, self.tools = client, name, tools
        self.messages = [{"role": "system", "content": system}]

    def call(self, **kw):
        extra = {"tools": self.tools} if self.tools else {}
        r = self.client.chat.completions.create(model="gemma", messages=self.messages, max_tokens=MAX_TOKENS,
                                                temperature=0, **extra, **kw)
        return r.choices[0].message

    def echo(self, msg) -> None:
        """Send the reply back as the server generated it (what a well-behaved client does)."""
        self.messages.append(msg.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio",
                                                                        "function_call"}))


def drive(base_url: str) -> list[Sent]:
    """Run the session against `base_url` (no /v1), return the ground truth of every call, in order."""
    from anthropic import Anthropic
    from openai import OpenAI

    oa = OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=600)
    an = Anthropic(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    sent: list[Sent] = []

    clock = _Chat(oa, "clock", _clock(1) + TOOL_DOC)
    edit = _Chat(oa, "edit", TOOL_DOC)
    tools = _Chat(oa, "tools", TOOL_DOC, TOOLS)
    notes: list[dict] = []
    summary: list[dict] = []
    summary_system = "You review pull requests for a small Python library. Be terse. " * 6
    summary_meta = {"user_id": "user_4f1c_account_77aa_session_0b5e2d9a-3c1f-4e0a-9d7e-2b6f8c1a5e33"}
    resp_input: list[dict] = []
    instructions = "You answer questions about the build system. Reply in one sentence."

    clock_q = ["Which tool lists a directory?", "And which one searches?", "How do I run one test?",
               "Show the recent commits.", "What does apply_patch take?"]
    edit_q = ["Open the file setup.py please.", "Now list the tests directory.", "Run the tests.",
              "Which tests failed?", "Fix the first failure."]

    def anthropic_turn(msgs, *, system=None, stream=False, metadata=None):
        kw = dict(model="gemma", max_tokens=MAX_TOKENS, messages=msgs)  # anthropic 2.x takes no temperature
        if system:
            kw["system"] = system
        if metadata:
            kw["metadata"] = metadata
        if stream:
            with an.messages.stream(**kw) as s:
                return s.get_final_message()
        return an.messages.create(**kw)

    def a_text(m) -> str:
        return "".join(b.text for b in m.content if getattr(b, "type", "") == "text")

    for turn in range(1, 6):
        # clock: the time at the top of the system prompt changes every turn
        if turn > 1:
            clock.messages[0] = {"role": "system", "content": _clock(turn) + TOOL_DOC}
        clock.messages.append({"role": "user", "content": clock_q[turn - 1]})
        clock.echo(clock.call())
        sent.append(Sent("clock", turn, "chat", *(("system_changed", 0) if turn > 1 else (None, None))))

        # edit: the first user message rewritten at turn 3
        change = None
        if turn == 3:
            edit.messages[1] = {"role": "user", "content": "Open the file pyproject.toml please."}
            change = ("message_edited", 1)
        edit.messages.append({"role": "user", "content": edit_q[turn - 1]})
        edit.echo(edit.call())
        sent.append(Sent("edit", turn, "chat", *(change or (None, None))))

        # tools: its own tool call sent back instead of the model's reply (turns 2, 3), then a new tool
        change = None
        if turn == 1:
            tools.messages.append({"role": "user", "content": "Find where parse_args is defined."})
        elif turn in (2, 3):
            k = len(tools.messages)
            tools.messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{turn}", "type": "function",
                 "function": {"name": "grep", "arguments": '{"path": "src", "pattern": "def parse_args"}'}}]})
            tools.messages.append({"role": "tool", "tool_call_id": f"call_{turn}",
                                   "content": f"src/cli.py:{40 + turn}: def parse_args(argv):"})
            change = ("reply_not_echoed", k)
        elif turn == 4:
            tools.echo(last_tools_reply)  # noqa: F821 (set below at turn 3)
            tools.messages.append({"role": "user", "content": "Thanks. Now read src/cli.py."})
        else:
            tools.echo(last_tools_reply)  # noqa: F821
            tools.messages.append({"role": "user", "content": "Run the tests of the cli."})
            tools.tools = MORE_TOOLS
            change = ("tools_changed", 0)
        last_tools_reply = tools.call()
        sent.append(Sent("tools", turn, "chat", *(change or (None, None))))

        if turn <= 4:
            # notes: anthropic, no system prompt; a note and its answer inserted before the last turn at turn 3
            change = None
            qs = ["My build fails on Windows.", "It says 'cl.exe not found'.", "Where do I set the path?",
                  "Thanks, it builds now."]
            if turn == 3:
                notes[2:2] = [{"role": "user", "content": "(note: I use Visual Studio 2022.)"},
                              {"role": "assistant", "content": "Noted."}]
                change = ("message_inserted", 2)
            notes.append({"role": "user", "content": qs[turn - 1]})
            m = anthropic_turn(notes, stream=turn % 2 == 0)
            notes.append({"role": "assistant", "content": a_text(m) or "..."})
            sent.append(Sent("notes", turn, "anthropic", *(change or (None, None))))

            # summary: anthropic with a system prompt; compacted at turn 4
            change = None
            qs = ["Review: the new retry decorator.", "Is the backoff right?", "And the tests?",
                  "Anything else before merging?"]
            if turn == 4:
                summary[:] = [{"role": "user", "content": "Summary of the review so far: retry decorator looks "
                                                          "fine, backoff doubles, tests cover two cases."},
                              {"role": "assistant", "content": "Understood."}]
                change = ("compacted", 1)
            summary.append({"role": "user", "content": qs[turn - 1]})
            m = anthropic_turn(summary, system=summary_system, stream=turn == 2, metadata=summary_meta)
            summary.append({"role": "assistant", "content": a_text(m) or "..."})
            sent.append(Sent("summary", turn, "anthropic", *(change or (None, None))))

        if turn <= 3:
            # responses: the Responses API; its instructions change at turn 3
            change = None
            if turn == 3:
                instructions = "You answer questions about the build system and CI. Reply in one sentence."
                change = ("system_changed", 0)
            resp_input.append({"role": "user", "content": ["Which build tool is used?", "How do I clean?",
                                                           "And in CI?"][turn - 1]})
            kw = dict(model="gemma", input=resp_input, instructions=instructions, max_output_tokens=MAX_TOKENS,
                      temperature=0)
            if turn == 2:  # streamed: the raw events (b11312's carry no content_index, which the SDK's
                # responses.stream() helper needs), the output items from response.completed
                out = [e.response.output for e in oa.responses.create(**kw, stream=True)
                       if e.type == "response.completed"][0]
            else:
                out = oa.responses.create(**kw).output
            resp_input += [o.model_dump(exclude_none=True) for o in out]  # its output items, sent back
            sent.append(Sent("responses", turn, "responses", *(change or (None, None))))
    return sent
