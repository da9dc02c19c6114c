"""One llama-server log line, split into its parts: timestamp, level letter, source (`slot`, `srv`,
`que`, `res`, `spec`, `cmn`, or a library function such as `llama_context`), function, slot id, task id
and the message text the server formatted.

The server prints `slot %12.*s: id %2d | task %d | <msg>` and `srv  %12.*s: <msg>` (server-common.h),
optionally preceded by common_log's prefix `<min>.<sec>.<ms>.<us> <L> ` (timestamps on / off) with ANSI
colours around its parts (a terminal or `--log-colors`), and possibly by whatever a supervisor adds in
front (docker compose's `name  | `, journald's `date host prog[pid]: `). `parse_line` strips the colours,
finds the server's own part anywhere in the first `MAX_SCAN` characters and never raises: a line it
cannot read (a continuation line, a binary blob, a truncated line) comes back with `src=None` and the
whole (cleaned, size-capped) text as `msg`."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: lines longer than this are cut before anything is matched (a 10 MB line costs no more than this)
MAX_SCAN = 64 * 1024
#: at most this many characters of a line are kept in an event's message
MAX_MESSAGE = 4096

LEVELS = {"I": "INF", "W": "WRN", "E": "ERR", "D": "DBG", "T": "TRC", "O": "INF"}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[@-Z\\-_]")
_TS = r"(?P<ts>\d+\.\d{2}\.\d{3}\.\d{3})"
_LVL = r"(?P<lvl>[IWEDTO])"
# the server's own prefix: `slot <func>: `, `srv  <func>: ` (func right-aligned in 12 columns)
_SERVER = re.compile(
    rf"(?:{_TS}\s+)?(?:{_LVL}\s+)?(?P<src>slot|srv|que|res|spec|cmn)\s+(?P<func>[^\s:][^\s]{{0,11}}?): (?P<rest>.*)",
    re.S)
_SLOT = re.compile(r"id\s+(?P<slot>-?\d+) \| task (?P<task>-?\d+) \| (?P<msg>.*)", re.S)
# any other common_log line: `<ts> <L> name: msg` (library functions: llama_context, print_info, ...)
_OTHER = re.compile(rf"(?:{_TS}\s+)?(?:{_LVL}\s+)?(?P<func>[A-Za-z_][\w:.<>~()-]{{0,63}}): ?(?P<rest>.*)", re.S)
_RESTART = re.compile(r"[\s|\]:](?P<at>\d+\.\d{2}\.\d{3}\.\d{3}\s+[IWEDTO]\s)")
_PREFIX_ONLY = re.compile(rf"^\s*{_TS}\s+(?:{_LVL}\s+)?(?P<rest>.*)", re.S)


@dataclass(frozen=True)
class LogLine:
    """A parsed line. `src` None: not a line the server's log macros wrote (kept as plain text)."""

    raw_len: int  # length of the line as given (before cutting)
    t: float | None  # seconds, from the timestamp prefix (None without one)
    level: str | None  # INF / WRN / ERR / DBG from the level letter (None without one; TRC prints as I)
    src: str | None  # slot, srv, que, res, spec, cmn, or "lib" for a library function's line
    func: str | None  # the function (cut to 12 characters by the server's macros)
    slot: int  # -1 for srv lines
    task: int  # -1 for srv lines
    msg: str  # the message as the server formatted it (after `| task T | ` or `func: `), capped

    @property
    def is_server(self) -> bool:
        return self.src in ("slot", "srv", "que", "res", "spec", "cmn")


def _seconds(ts: str | None) -> float | None:
    if not ts:
        return None
    m, s, ms, us = ts.split(".")
    return int(m) * 60 + int(s) + int(ms) / 1e3 + int(us) / 1e6


def _cap(text: str, n: int) -> str:
    if len(text) <= MAX_MESSAGE:
        return text
    return text[:MAX_MESSAGE] + f" [... {n - MAX_MESSAGE} characters not kept]"


def clean(line: str) -> str:
    """The line without its end-of-line characters, ANSI colour / erase codes and stray carriage returns."""
    s = line[:MAX_SCAN] if len(line) > MAX_SCAN else line
    s = s.rstrip("\r\n")
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    if "\r" in s:
        s = s.replace("\r", "")
    return s


def parse_line(line: str | bytes) -> LogLine:
    """Split one log line; never raises (bytes are decoded as UTF-8 with replacement characters)."""
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line[: MAX_SCAN * 4]).decode("utf-8", "replace")
    n = len(line)
    s = clean(line)
    m = _SERVER.match(s)
    if m is None:
        # a supervisor's prefix in front (docker, journald, a pipe through `ts`): look further in
        m = _SERVER.search(s, 0, min(len(s), 512))
        if m is not None and m.start() > 0 and not s[m.start() - 1].isspace() and s[m.start() - 1] not in "|]:":
            m = None
    if m is not None:
        src, func, rest = m.group("src"), m.group("func"), m.group("rest")
        slot = task = -1
        if src == "slot":
            sm = _SLOT.match(rest)
            if sm is not None:
                slot, task, rest = int(sm.group("slot")), int(sm.group("task")), sm.group("msg")
        return LogLine(n, _seconds(m.group("ts")), LEVELS.get(m.group("lvl") or ""), src, func, slot, task,
                       _cap(rest, n))
    r = _RESTART.search(s, 1, min(len(s), 512))
    if r is not None:  # a supervisor's prefix before a common_log prefix: read from there
        return parse_line(s[r.start("at"):])
    m = _OTHER.match(s)
    if m is not None:
        return LogLine(n, _seconds(m.group("ts")), LEVELS.get(m.group("lvl") or ""), "lib", m.group("func"), -1, -1,
                       _cap(m.group("rest"), n))
    m = _PREFIX_ONLY.match(s)
    if m is not None:  # a timestamped line of another shape
        return LogLine(n, _seconds(m.group("ts")), LEVELS.get(m.group("lvl") or ""), None, None, -1, -1,
                       _cap(m.group("rest"), n))
    return LogLine(n, None, None, None, None, -1, -1, _cap(s, n))
