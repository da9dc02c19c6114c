"""Message spans from `message_delimiters` (request field): where user messages start in a prompt,
so checkpoints land there (spec 4.2; `common_chat_msg_delimiters::split`, common/chat.cpp).

Each delimiter is tokenized without BOS but with special tokens parsed; the prompt is scanned left to
right and at every index the FIRST delimiter whose tokens match there opens a span (no skipping past
a match: a delimiter can match again inside it); each span ends where the next one starts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROLES = ("system", "assistant", "user", "tool")


@dataclass(frozen=True)
class MessageSpans:
    spans: tuple[tuple[str, int, int], ...] = ()  # (role, pos, len)

    def is_user_start(self, pos: int) -> bool:
        return any(r == "user" and p == pos for r, p, _ in self.spans)

    def user_starts(self) -> np.ndarray:
        return np.array([p for r, p, _ in self.spans if r == "user"], dtype=np.int64)

    def last_user_message_pos(self) -> int:
        for r, p, _ in reversed(self.spans):
            if r == "user":
                return p
        return -1


def parse_delimiters(value) -> list[tuple[str, str]]:
    """`common_chat_msg_delimiters_parse`: a list of {role, delimiter}; anything else is ignored."""
    if not isinstance(value, list):
        return []
    out = []
    for d in value:
        if isinstance(d, dict):
            role = d.get("role", "")
            out.append((role if role in ROLES else "", str(d.get("delimiter", ""))))
    return out


def find_message_spans(tokens: np.ndarray, delimiters: list[tuple[str, np.ndarray]]) -> MessageSpans:
    """`split()` on text tokens. `delimiters` = [(role, delimiter tokens)] in priority order."""
    toks = np.asarray(tokens, dtype=np.int32)
    n = len(toks)
    if not delimiters or n == 0:
        return MessageSpans()
    first = np.full(n, -1, dtype=np.int64)  # index of the first delimiter matching at i
    for k, (_, d) in enumerate(delimiters):
        d = np.asarray(d, dtype=np.int32)
        L = len(d)
        if L > n:
            continue
        if L == 0:
            hit = np.ones(n, dtype=bool)
        else:
            win = np.lib.stride_tricks.sliding_window_view(toks, L)
            hit = np.zeros(n, dtype=bool)
            hit[: n - L + 1] = (win == d).all(axis=1)
        first[(first < 0) & hit] = k
    idx = np.flatnonzero(first >= 0)
    bounds = list(idx) + [n]
    spans = tuple((delimiters[first[i]][0], int(i), int(bounds[j + 1] - i)) for j, i in enumerate(idx))
    return MessageSpans(spans)
