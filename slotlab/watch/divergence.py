"""The text around each prompt's divergence, where the server's log has it.

With `LLAMA_SERVER_SLOTS_DEBUG=1` llama-server prints, for a task that reuses part of what its slot holds
(`0 < n_past <= slot tokens`), four WRN lines (server-context.cpp 3287-3328 at b11312):

    slot   operator(): id  0 | task 3 | old: ...  is 09:1 | 4:05.
    slot   operator(): id  0 | task 3 | new: ...  is 09:1 | 5:41.
    slot   operator(): id  0 | task 3 |      563  236743 ...     (the old tokens' ids, 8 columns each)
    slot   operator(): id  0 | task 3 |      563  236743 ...     (the new ones)

the pieces of the tokens `n_past - N .. n_past + N + 2` (N = `LLAMA_SERVER_SLOTS_N_DIFF`, default 0; cut
at the shorter of the two), ` | ` at `n_past`. A piece with a newline in it carries the line on to the
next raw log line, which has no prefix. A pair without ` | ` is a prompt that took all the slot held:
no divergence. This module reads those blocks from the raw lines; the LogReader keeps them as plain
log lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slotlab.watch.lines import parse_line

_TEXT = re.compile(r"^(old|new): \.\.\. ?(.*)$", re.S)
_IDS = re.compile(r"^(?: +-?\d+)+$")
MARK = " | "


@dataclass
class Divergence:
    """One task's pair: the slot's tokens (`held`) and the prompt's (`prompt`) around `n_past`."""

    slot: int
    task: int
    held: str = ""
    prompt: str = ""
    held_ids: list = field(default_factory=list)
    prompt_ids: list = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return MARK in self.held or MARK in self.prompt

    def as_dict(self) -> dict:
        return {"slot": self.slot, "task": self.task, "held": self.held, "prompt": self.prompt,
                "held_ids": self.held_ids, "prompt_ids": self.prompt_ids}


def read_divergences(lines) -> dict[int, Divergence]:
    """task id -> its Divergence (the last pair the log shows for that task), from raw log lines."""
    out: dict[int, Divergence] = {}
    cur: Divergence | None = None
    into: str | None = None  # "held" / "prompt" while a text goes on over raw lines
    n_ids = 0
    for raw in lines:
        if isinstance(raw, (bytes, bytearray)):
            raw = bytes(raw).decode("utf-8", "replace")
        raw = raw.rstrip("\r\n")
        ln = parse_line(raw)
        if ln.src is None or (ln.t is None and not ln.is_server):  # no prefix: a continuation, perhaps
            if cur is not None and into is not None:
                setattr(cur, into, getattr(cur, into) + "\n" + raw)
            continue
        into = None
        if ln.src != "slot" or ln.level not in (None, "WRN"):
            continue
        m = _TEXT.match(ln.msg)
        if m:
            if m.group(1) == "old":
                cur, n_ids = Divergence(ln.slot, ln.task, held=m.group(2)), 0
                into = "held"
            elif cur is not None and cur.task == ln.task:
                cur.prompt, into = m.group(2), "prompt"
            continue
        if cur is not None and cur.task == ln.task and _IDS.match(ln.msg):
            ids = [int(x) for x in ln.msg.split()]
            if n_ids == 0:
                cur.held_ids = ids
            else:
                cur.prompt_ids = ids
                out[cur.task] = cur
                cur = None
            n_ids += 1
    return out


def short(text: str, width: int = 160) -> str:
    """One line of a divergence's text for a terminal: newlines shown as \\n, cut in the middle."""
    t = text.replace("\n", "\\n")
    return t if len(t) <= width else t[: width // 2 - 1] + "…" + t[-(width // 2):]
