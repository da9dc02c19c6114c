"""The part of llama.cpp's differential template analysis (`common/chat-diff-analyzer.cpp`, the
"autoparser") that decides the prompt text: a template's reasoning markers.

llama-server renders a conversation ending in an assistant message (prefill) as the template's
generation prompt, cut at the reasoning start marker, + start + reasoning + end + the content; and it
passes `enable_thinking` to templates only when reasoning markers were found. The markers are found
by rendering probe conversations and diffing them, which is reproduced here with the same probes,
the same marker segmentation (`<...>` and `[...]`) and the same diff (`calculate_diff_split`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

USER_MSG = "U_USER_MSG Hello END_U"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
THINKING_CONTENT = "REASON_PART I am thinking END_R"

MARKER, TEXT = "marker", "text"
_WS = " \t\n\r\f\v"
_MARK = r"(?:<[^>]*>|\[[^\]]*\])"
_SP = r"[ \t\n\r]*"


def trim_whitespace(s: str) -> str:
    return s.strip(_WS)


def segmentize_markers(text: str) -> list[tuple[str, str]]:
    """`segmentize_markers`: text split into `<...>` / `[...]` markers and the text between."""
    out: list[tuple[str, str]] = []
    in_marker, opener, last = False, "", 0
    for i, c in enumerate(text):
        if not in_marker and c in "<[":
            if last < i:
                out.append((TEXT, text[last:i]))
            last, in_marker, opener = i, True, c
        elif in_marker and ((opener == "<" and c == ">") or (opener == "[" and c == "]")):
            out.append((MARKER, text[last:i + 1]))
            last, in_marker, opener = i + 1, False, ""
    if last < len(text):
        out.append((TEXT, text[last:]))
    return out


def _common_prefix_len(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _common_suffix_len(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


@dataclass
class Diff:
    prefix: str = ""
    suffix: str = ""
    left: str = ""
    right: str = ""


def calculate_diff_split(left: str, right: str) -> Diff:
    """A port of `calculate_diff_split` (chat-auto-parser-helpers.cpp): the common prefix and suffix of
    two renders at marker granularity, then at character granularity inside the differing text."""
    r = Diff()
    L, R = segmentize_markers(left), segmentize_markers(right)
    if not L:
        r.right = right
        return r
    if not R:
        r.left = left
        return r
    ls, le, rs, re_ = 0, len(L) - 1, 0, len(R) - 1
    left_done = right_done = False
    while ls != le and rs != re_:
        advanced = False
        if L[ls] == R[rs]:
            r.prefix += L[ls][1]
            ls += 1
            rs += 1
            advanced = True
        if L[le] == R[re_]:
            r.suffix = L[le][1] + r.suffix
            if ls != le:
                le -= 1
            else:
                left_done = True
            if rs != re_:
                re_ -= 1
            else:
                right_done = True
            advanced = True
        if not advanced:
            break
    if ls == le and rs != re_:
        if L[ls] == R[re_]:
            r.suffix = R[re_][1] + r.suffix
            re_ -= 1
            left_done = True
        elif L[ls] == R[rs]:
            r.prefix += R[rs][1]
            rs += 1
            left_done = True
    elif rs == re_ and ls != le:
        if L[le] == R[rs]:
            r.suffix = L[le][1] + r.suffix
            le -= 1
            right_done = True
        elif L[ls] == R[rs]:
            r.prefix += L[ls][1]
            ls += 1
            right_done = True
    elif ls == le and rs == re_ and L[ls] == R[rs] and L[ls][0] == MARKER:
        r.prefix += R[rs][1]
        left_done = right_done = True
    text_suffix = L[le][0] == TEXT and R[re_][0] == TEXT
    text_prefix = R[rs][0] == TEXT and L[ls][0] == TEXT
    rem_l = "".join(v for _, v in L[ls:(le if left_done else le + 1)])
    rem_r = "".join(v for _, v in R[rs:(re_ if right_done else re_ + 1)])
    suf = _common_suffix_len(rem_l, rem_r) if text_suffix else 0
    pre = _common_prefix_len(rem_l[:len(rem_l) - suf], rem_r[:len(rem_r) - suf]) if text_prefix else 0
    r.prefix += rem_l[:pre]
    r.suffix = rem_l[len(rem_l) - suf:] + r.suffix
    r.left = rem_l[pre:len(rem_l) - suf]
    r.right = rem_r[pre:len(rem_r) - suf]
    if r.left == "" and r.right == "":
        r.prefix, r.suffix = left, ""
    if r.left == "" and r.right != "" and len(left) <= len(right) and right[:len(left)] == left:
        r.prefix, r.suffix, r.right = left, "", right[len(left):]
    return r


@dataclass
class Reasoning:
    """`analyze_reasoning`'s result: mode "none" or "tag", and the start/end markers."""
    mode: str = "none"
    start: str = ""
    end: str = ""


# render(messages, add_generation_prompt, enable_thinking) -> text, or None when the template failed
Render = Callable[[list, bool, bool], "str | None"]


def analyze_reasoning(render: Render, source: str) -> Reasoning:
    """`compare_reasoning_presence` + `compare_thinking_enabled` + the "old Qwen/DeepSeek" workaround
    (the probes that decide markers without tools)."""
    res = Reasoning()
    user = {"role": "user", "content": USER_MSG}
    plain = {"role": "assistant", "content": ASSISTANT_MSG}
    thinking = {"role": "assistant", "content": ASSISTANT_MSG, "reasoning_content": THINKING_CONTENT}
    # reasoning presence: an assistant message with and without reasoning_content
    a, b = render([user, plain], False, True), render([user, thinking], False, True)
    if a is not None and b is not None:
        d = calculate_diff_split(a, b)
        if d.right and THINKING_CONTENT in d.right:
            t = re.escape(THINKING_CONTENT)
            m = re.search(f"(?P<pre>{_MARK}{_SP}){t}(?P<post>{_SP}{_MARK}{_SP})", b)
            if m is None:
                m = re.search(f"{t}{_SP}(?P<post>{_MARK}{_SP})?", b)
            if m is not None:
                pre, post = m.groupdict().get("pre") or "", m.group("post") or ""
                if pre and post:
                    res.mode, res.start, res.end = "tag", pre, post
                elif post:
                    res.mode, res.end = "tag", post
    # thinking enabled: the generation prompt with enable_thinking false (A) and true (B)
    a, b = render([user], True, False), render([user], True, True)
    if a is not None and b is not None:
        d = calculate_diff_split(a, b)
        lt, rt = trim_whitespace(d.left), trim_whitespace(d.right)
        if not lt and d.right:
            if rt and b.endswith(rt) and not res.start:
                res.start, res.mode = d.right, "tag"
        elif not rt and d.left:
            if lt and a.endswith(lt) and not res.end:
                seg = [s for s in segmentize_markers(a) if trim_whitespace(s[1])]
                if len(seg) >= 2 and seg[-1][1] == lt and seg[-2][0] == MARKER:
                    res.start = seg[-2][1]
                res.end, res.mode = d.left, "tag"
        elif lt and rt:
            for base, extended in ((b, a), (a, b)):
                n = min(len(base), 64)
                anchor = base[len(base) - n:]
                pos = extended.rfind(anchor)
                if pos == -1 or pos + n >= len(extended):
                    continue
                extra = trim_whitespace(extended[pos + n:])
                if not extra:
                    continue
                seg = [s for s in segmentize_markers(extra) if trim_whitespace(s[1])]
                if len(seg) == 2 and seg[0][0] == MARKER and seg[1][0] == MARKER:
                    res.start = res.start or seg[0][1]
                    res.end = res.end or seg[1][1]
                    res.mode = "tag"
                    break
        if res.mode == "none" and not res.start and res.end:
            res.mode = "tag"
    # workaround: old reasoning Qwen/DeepSeek templates strip <think> from history but still think
    if ("content.split('</think>')" in source and "reasoning_content" not in source
            and "<SPECIAL_12>" not in source and res.mode == "none"):
        res.mode, res.start, res.end = "tag", "<think>", "</think>"
    if "Write your thoughts between <think></think> and write your response between <response></response>" in source:
        res.mode, res.start, res.end = "tag", "<think>", "</think>"  # Granite 3.3
    if all(k in source for k in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        res.mode, res.start, res.end = "tag", "<think>\n", "</think>"  # Nemotron Nano v2
    if "laguna_glm_thinking" in source:
        res.start, res.end = trim_whitespace(res.start), trim_whitespace(res.end)  # Laguna
    return res
