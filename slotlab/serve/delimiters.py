"""The message delimiters llama-server sends with a chat request: where user messages start in the
prompt, so the slot can take a checkpoint there (server-context.cpp 3530-3609 at the pin).

Why a module of its own: the server does not hard-code them per format. A template that one of its
specialized parsers claims (`common_chat_try_specialized_template`, common/chat.cpp 1091-1227 at b11312)
brings the parser's fixed list; every other Jinja template goes through the differential "autoparser",
which renders probe conversations and diffs them (`detect_assistant_start_marker` /
`detect_user_start_marker`, chat-diff-analyzer.cpp 347-432), then applies its per-template patches;
common/chat.cpp 1339-1349 keeps the assistant start, then the user start, each when not empty. The
legacy route (`--no-jinja`) sends none. So ChatML gives `<|im_start|>assistant` and `<|im_start|>user`
(no system delimiter, no newline), Gemma `<start_of_turn>model` and `<start_of_turn>user`."""

from __future__ import annotations

from typing import Callable

from slotlab.serve.template_diff import (ASSISTANT_MSG, MARKER, TEXT, USER_MSG, Reasoning, calculate_diff_split,
                                         segmentize_markers, trim_whitespace)

USER_MSG_TWO = "V_USER_MSG Hello END_V"

# render(messages, add_generation_prompt, enable_thinking) -> text, or None where the template failed
Render = Callable[[list, bool, bool], "str | None"]


def _has(src: str, *needles: str) -> bool:
    return all(n in src for n in needles)


def _d(*pairs: tuple[str, str]) -> list[dict]:
    return [{"role": r, "delimiter": d} for r, d in pairs]


_CHATML_TOOLS = _d(("assistant", "<|im_start|>assistant"), ("tool", "<|im_start|>user\n<tool_response>"))


def specialized(src: str) -> list[dict] | None:
    """The fixed list of the specialized parser that claims `src` (same tests, same order as
    common_chat_try_specialized_template), [] for one that sets none, None when none claims it."""
    if _has(src, "[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]") and "[CALL_ID]" not in src:
        return []  # Ministral / Magistral Large 3
    if "<|channel|>" in src:  # GPT-OSS (parsers/gpt-oss.cpp)
        return _d(("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>developer"),
                  ("system", "<|start|>system"), ("tool", "<|start|>functions"))
    if _has(src, "<atem:function_calls>", "<|eom|>"):  # Muse Glimmer
        return _d(("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>system"),
                  ("tool", "<|start|>tool"))
    if _has(src, ">>>all", ">>>${recipient}"):
        return []  # Functionary v3.2
    if _has(src, "<|tool_calls_section_begin|>", "<|tool_call_begin|>"):
        return []  # Kimi K2 Thinking
    if _has(src, "<|open|>", "<|close|>", "<|end_of_msg|>"):  # Kimi K3
        return _d(("assistant", '<|open|>message role="assistant"<|sep|>'),
                  ("user", '<|open|>message role="user"<|sep|>'), ("tool", '<|open|>message role="tool"'),
                  ("system", '<|open|>message role="system"'))
    if _has(src, "<role>ASSISTANT</role>", "<arg_key>"):  # Ling 3.0 / Bailing V3
        return _d(("assistant", "<role>ASSISTANT</role>"), ("user", "<role>HUMAN</role>"),
                  ("tool", "<role>OBSERVATION</role>"), ("system", "<role>SYSTEM</role>"))
    if _has(src, "<|START_TEXT|>", "<|START_ACTION|>"):  # Cohere2 MoE
        t = "<|START_OF_TURN_TOKEN|>"
        return _d(("assistant", t + "<|CHATBOT_TOKEN|>"), ("user", t + "<|USER_TOKEN|>"),
                  ("tool", t + "<|SYSTEM_TOKEN|><|START_TOOL_RESULT|>"), ("system", t + "<|SYSTEM_TOKEN|>"))
    if _has(src, "<|tool_list_start|>", "<|tool_list_end|>"):
        return []  # LFM2
    if "List of tools: [" in src and "<|tool_list_start|>" not in src:
        return []  # LFM2.5
    if _has(src, "<|role_sep|>", "<|message_sep|>") and "<|function_call|>" not in src:
        return []  # GigaChat V3
    if _has(src, "]<]minimax[>[", "<tool_call>", "<invoke name="):  # MiniMax-M3
        return _d(("assistant", "]~b]ai"), ("user", "]~b]user"), ("tool", "]~b]tool"), ("system", "]~b]developer"),
                  ("system", "]~b]system"))
    if _has(src, "dsml_token", "DSML") and ("function_calls" in src or "tool_calls" in src):  # DeepSeek V3.2/V4
        return _d(("assistant", "<｜Assistant｜>"), ("user", "<｜User｜>"))
    if "'<|tool_call>call:'" in src:  # Gemma 4
        return _d(("user", "<|turn>user"), ("assistant", "<|turn>model"))
    if _has(src, "Tool usage guidelines:", '<function name="', '<param name="'):  # MiniCPM5
        return [*_CHATML_TOOLS, *_d(("user", "<|im_start|>user"), ("system", "<|im_start|>system"))]
    if (_has(src, "<tool_call>", "<function=", "<parameter=")
            and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in src):  # Qwen3-Coder, Qwen3.5, Nemotron Nano 3
        return [*_CHATML_TOOLS, *_d(("tool", "<|im_start|>tool_response"), ("user", "<|im_start|>user"),
                                    ("system", "<|im_start|>system"))]
    return None


def _compare(render: Render, a: tuple, b: tuple):
    """`compare_variants`: both renders, or None when either failed (the C++ catches every exception)."""
    outs = []
    for msgs in (a, b):
        try:
            out = render(list(msgs), False, True)
        except Exception:  # noqa: BLE001 - apply_template: any failure is ERR_TMPL, the analysis moves on
            out = None
        if out is None:
            return None
        outs.append(out)
    return calculate_diff_split(*outs)


def assistant_start(render: Render, reasoning: Reasoning) -> str:
    """`detect_assistant_start_marker`: what a rendered assistant turn adds before its text, cut at the
    reasoning markers."""
    user = {"role": "user", "content": USER_MSG}
    d = _compare(render, (user,), (user, {"role": "assistant", "content": ASSISTANT_MSG}))
    if d is None:
        return ""
    i = d.right.find(ASSISTANT_MSG)
    prefix = d.right[:i] if i >= 0 else d.right  # substr(0, npos): the whole string
    for marker in (reasoning.start, reasoning.end):
        m = trim_whitespace(marker)
        if marker and m in prefix:
            prefix = prefix[:prefix.find(m)]
    return trim_whitespace(prefix)


def user_start(render: Render) -> str:
    """`detect_user_start_marker`: what a rendered user turn adds before its text (no messages vs one; where
    the template cannot render no messages, a user turn after a user/assistant exchange), less leading
    end markers and blank text."""
    user, user2 = {"role": "user", "content": USER_MSG}, {"role": "user", "content": USER_MSG_TWO}
    asst = {"role": "assistant", "content": ASSISTANT_MSG}
    d = _compare(render, (), (user,))
    if d is None:
        d = _compare(render, (user2, asst), (user2, asst, user))
        if d is None:
            return ""
    msg = d.right
    if ASSISTANT_MSG in msg:
        msg = msg[msg.find(ASSISTANT_MSG) + len(ASSISTANT_MSG):]
    i = msg.find(USER_MSG)
    candidate = msg[:i] if i >= 0 else msg
    out, seen_marker = [], False
    for kind, value in segmentize_markers(candidate):
        low = value.lower()
        if kind == MARKER and not seen_marker and ("end" in low or "close" in low):
            continue
        if kind == TEXT and not seen_marker and not trim_whitespace(value):
            continue
        seen_marker |= kind == MARKER
        out.append(value)
    return trim_whitespace("".join(out))


def _patched(src: str, assistant: str, user: str) -> tuple[str, str]:
    """The autoparser's per-template patches that set the starts (chat-diff-analyzer.cpp 36-233)."""
    if _has(src, "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"):
        # Cohere Command R+; the C++ patch also asks that its content analysis found no content start
        # marker, an analysis slotlab does not reproduce: taken as none found
        user = "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"
    if _has(src, "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>"):  # Nemotron Nano v2
        assistant, user = "<SPECIAL_11>Assistant", "<SPECIAL_11>User"
    if ("{%- set system_prompt = '<|start_header_id|>' + 'system' + '<|end_header_id|>\\n\\n' + message['content'] "
            "| trim + '\\n' + system_prompt_suffix + '<|eot_id|>' -%}") in src:  # Fireworks v2
        assistant, user = "<|start_header_id|>assistant<|end_header_id|>", "<|start_header_id|>user<|end_header_id|>"
    if "<|begin|>assistant<|think|><|end|>" in src:  # Solar Open
        assistant = "<|begin|>assistant"
    if "if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text" in src:  # Apriel 1.6
        user, assistant = "<|begin_user|>", "<|begin_assistant|>"
    return assistant, user


def message_delimiters(src: str, render: Render, reasoning: Reasoning) -> list[dict]:
    """The list the chat path puts in the request (`message_delimiters`), for a Jinja template."""
    fixed = specialized(src)
    if fixed is not None:
        return fixed
    a, u = _patched(src, assistant_start(render, reasoning), user_start(render))
    return [*_d(("assistant", a))[:bool(a)], *_d(("user", u))[:bool(u)]]
