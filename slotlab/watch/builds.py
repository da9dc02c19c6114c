"""Which llama.cpp build wrote a log, and what that changes for the reader.

slotlab models one build: `MODELLED` (b11312, the llama.cpp vendored by llama-cpp-python 0.3.36, commit
0c1e570). Users run whatever build they have, and between b9800 (mid-2026) and b11434 a few of the
messages the reader maps changed their text, and some appeared for the first time. This module is the
one place that knows it:

* `build_line(ln)` reads the build from the start-up line llama-server prints at `-lv 4`
  (`common_params_print_info: build 11434 (hash) with ...`; older builds `build: N (hash) with ...`).
  A build made outside llama.cpp's git (an sdist, a vendored copy) prints whatever its enclosing git
  repository counts (the pin's golden logs say `build 1 (0c1e570)`): a number below `OLDEST` is not
  taken as a build, the commit is looked up in `KNOWN_COMMITS` instead.
* `TEXTS` lists each message whose text changed, with the build that changed it; `normalize` turns an
  older text into the modelled one (so the reader's patterns, which are the modelled build's, read it)
  and `render` does the reverse (the tests rewrite real golden lines to every build's texts with it).
* `ADDED` lists the lines a build before `since` never prints, and the fact the reader then lacks.
* `BuildWatch` follows one log: the build it names (or, without a start-up line, the range of builds
  its texts allow), the facts that log cannot give, and the one warning when it is not `MODELLED`.

The texts are the servers' own (tools/server/server-context.cpp, server-task.cpp); the build numbers of
the changes are those of llama.cpp's history (docs/server-behaviour.md, "Other builds")."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from slotlab.llama.build import LLAMA_CPP_BUILD as MODELLED  # the build slotlab models (b11312)
from slotlab.llama.build import LLAMA_CPP_COMMIT as MODELLED_COMMIT

#: the oldest and the newest build whose logs the reader knows
OLDEST, NEWEST = 9800, 11434
#: commits of builds whose log cannot name their own number (built outside llama.cpp's git)
KNOWN_COMMITS = {MODELLED_COMMIT: MODELLED}


def name(build: int | None) -> str:
    return f"b{build}" if build is not None else "an unknown build"


@dataclass(frozen=True)
class TextChange:
    """A message whose text changed at build `since`: builds before it print `old`, later ones `new`.
    `new_re` / `old_re` find the text in a message; the replacement keeps the rest of it."""

    since: int
    line: str  # the reader's name for the message (slotlab/watch/patterns.py)
    old: str  # the old text, as it is shown to the user
    new: str
    old_re: re.Pattern
    to_new: str  # replacement for old_re's match
    new_re: re.Pattern
    to_old: str  # replacement for new_re's match


def _change(since: int, line: str, old: str, new: str, anchor: str = "", shown: tuple[str, str] | None = None
            ) -> TextChange:
    """A change of the literal `old` to `new` in a message that starts with `anchor` + old (anchor: a
    regex, the part kept); `shown`: how the two texts are named to the user (default: old, new)."""
    grp = "(" + (anchor or "^") + ")"
    old_s, new_s = shown or (old.strip(), new.strip())
    return TextChange(since, line, old_s, new_s, re.compile(grp + re.escape(old)), r"\g<1>" + new,
                      re.compile(grp + re.escape(new)), r"\g<1>" + old)


_NUMS = r"-?(?:nan|inf|[\d.]+)"
#: every text change of a mapped message between OLDEST and NEWEST, oldest first
TEXTS: tuple[TextChange, ...] = (
    _change(9829, "ckpt_check", "Checking checkpoint with [", "checking checkpoint with ["),
    _change(10178, "by_lcp", "selected slot by LCP similarity, sim_best = ",
            "selected slot by LCP similarity, f_sim_best = "),
    _change(10178, "load_base", ", sim = ", ", f_sim = ", rf"^ - looking for better prompt, base f_keep = {_NUMS}",
            ("looking for better prompt, base f_keep = ..., sim =", "..., f_sim =")),
    _change(10178, "load_found", ", sim = ", ", f_sim = ", rf"^ - found better prompt with f_keep = {_NUMS}",
            ("found better prompt with f_keep = ..., sim =", "..., f_sim =")),
)


@dataclass(frozen=True)
class Added:
    """Lines (the reader's names) that builds before `since` never print, and what a log then lacks."""

    since: int
    lines: tuple[str, ...]
    fact: str


ADDED: tuple[Added, ...] = (
    Added(9908, ("evict_make_room",),
          "which RAM-cache entries were removed to make room for a new one before it was saved"),
    Added(9978, ("ckpt_too_close",), "which context checkpoints were erased for being too close to an earlier one"),
    Added(10178, ("skip_busy", "skip_empty", "sim"),
          "which slots the LCP selection skipped (busy or empty) and each idle slot's similarity, and so "
          "every successful slot restore (the reader sees one by the similarity of a slot it holds empty)"),
    Added(10178, ("load_score",), "each RAM-cache entry's lcp, f_keep and f_sim when a better prompt was looked for"),
    Added(11312, ("ckpt_supersede",), "which context checkpoints a new one at the same n_tokens superseded"),
)

#: what a build after MODELLED decides or reports differently, by first build (docs/server-behaviour.md)
NEWER: tuple[tuple[int, str], ...] = (
    (11434, "sequence states are version 4 (LLAMA_STATE_SEQ_VERSION): every non-empty KV stream carries "
            "n_rot_k and n_rot_v (8 bytes; 16 on an iSWA model such as Gemma 3), so RAM-cache and checkpoint "
            "sizes are a few bytes larger than slotlab's, a byte-limit eviction within those bytes of the limit "
            "can go the other way, a slot file's n_written / n_read are larger, and slot files are not "
            "interchangeable with slotlab's (version 3)"),
    (11434, "JSON parse and type errors a route lets out (a body that is not JSON, /tokenize content or a slot "
            "action's filename of the wrong type) answer 400 (the pin: 500)"),
    (11549, "its slot files carry the slot's context checkpoints (appended on save, restored with the state: "
            "docs/server-behaviour.md 5.4a), so a request after a restore reuses the prefix up to them; "
            "run slotlab with --server-build 11549 to follow it"),
    (11549, "a /completion body's message_delimiters are no longer read (message spans come from a chat "
            "session only), so raw completions get no checkpoints at user messages"),
    (11549, "a /completion body's chat_format, generation_prompt, parse_tool_calls and chat_parser are ignored "
            "(the pin checks them: a wrong type is a 400)"),
)


def texts_of(build: int) -> dict[str, str]:
    """{line: the text `build` prints} for every changed message (the old text where build < since)."""
    return {c.line: (c.new if build >= c.since else c.old) for c in TEXTS}


def missing(build: int | None) -> list[str]:
    """The facts a log of `build` cannot give (None: an unknown build, where only the modelled build's
    lines are assumed)."""
    b = MODELLED if build is None else build
    return [a.fact for a in ADDED if b < a.since]


def lines_missing(build: int) -> set[str]:
    return {n for a in ADDED if build < a.since for n in a.lines}


def normalize(msg: str) -> tuple[str, TextChange | None]:
    """An older build's message in the modelled build's text, and the change that did it (None: the
    message is already the modelled text)."""
    for c in TEXTS:
        if c.old_re.search(msg):
            return c.old_re.sub(c.to_new, msg, count=1), c
    return msg, None


def render(msg: str, build: int) -> str:
    """A modelled-build message in `build`'s text (the tests' rewrite of real golden lines)."""
    for c in TEXTS:
        if build < c.since and c.new_re.search(msg):
            return c.new_re.sub(c.to_old, msg, count=1)
    return msg


_BUILD = re.compile(r"(?:^|[\s:])build:? (\d+) \(([0-9A-Za-z]+)\) with (.+?) for (\S+)")


def build_line(func: str | None, msg: str) -> tuple[int | None, str, str] | None:
    """(build or None, commit, how it was known) when a line is the start-up build line, else None. A
    build number below OLDEST is no llama.cpp build (built outside its git): the commit decides, through
    KNOWN_COMMITS."""
    m = _BUILD.search(f"{func or ''}: {msg}")
    if m is None:
        return None
    number, commit = int(m.group(1)), m.group(2)
    if number >= OLDEST:
        return number, commit, "start-up line"
    known = KNOWN_COMMITS.get(commit[:7])
    return known, commit, "commit" if known is not None else "not a build number"


@dataclass
class BuildWatch:
    """The build behind one log, as its lines tell it. `feed` every server line's (func, message)
    before matching; it gives the message in the modelled text."""

    build: int | None = None
    commit: str | None = None
    source: str | None = None  # "start-up line", "commit", "GET /props", or None (not named: the texts bound it)
    lo: int = OLDEST
    hi: int | None = None  # None: no upper bound known
    warned: bool = False
    seen_old: set = field(default_factory=set)  # the TextChanges whose old text this log printed

    def on_build_line(self, func: str | None, msg: str) -> bool:
        hit = build_line(func, msg)
        if hit is None:
            return False
        number, self.commit, how = hit
        if number is not None:
            self.build, self.source = number, how
        return True

    def on_build_info(self, info: str | None) -> bool:
        """`GET /props`'s `build_info` (`b11434-unknown`): names the build when the log did not (a
        `-lv 3` log has no start-up build line). True when it named it now."""
        m = re.fullmatch(r"b(\d+)-([0-9A-Za-z]+)", info or "")
        if self.build is not None or m is None:
            return False
        number, commit = int(m.group(1)), m.group(2)
        if number < OLDEST:
            number = KNOWN_COMMITS.get(commit[:7])
            if number is None:
                return False
        self.build, self.commit, self.source = number, commit, "GET /props"
        return True

    def normalize(self, msg: str, on_older=None) -> str:
        """`msg` in the modelled text; an older text bounds an unnamed build, and `on_older()` is
        called when it does (the reader warns then)."""
        out, change = normalize(msg)
        if change is not None and change not in self.seen_old:
            self.seen_old.add(change)
            self.hi = min(self.hi, change.since - 1) if self.hi is not None else change.since - 1
            if on_older is not None and self.build is None:
                on_older()
        return out

    def saw(self, line: str) -> None:
        """A mapped line was read: it narrows the range of an unnamed build (a line ADDED at b exists
        from b on, a changed message in its new text too)."""
        for a in ADDED:
            if line in a.lines:
                self.lo = max(self.lo, a.since)
        for c in TEXTS:
            if c.line == line and c not in self.seen_old:
                self.lo = max(self.lo, c.since)

    def assumed(self) -> int:
        """The build the facts are judged by: the named one; unnamed, the newest the texts allow, at
        most MODELLED."""
        if self.build is not None:
            return self.build
        return min(MODELLED, self.hi) if self.hi is not None else MODELLED

    def differs(self) -> list[str]:
        """What reading this build instead of MODELLED changes (empty when it is MODELLED or unknown
        and nothing in its texts says otherwise)."""
        b = self.assumed()
        out = []
        if b < MODELLED:
            old = [f"{c.old!r} for {c.new!r}" for c in TEXTS if b < c.since]
            if old:
                out.append(f"it prints {', '.join(old)} (read as b{MODELLED}'s texts)")
            lack = missing(b)
            if lack:
                out.append(f"its log lacks {'; '.join(lack)}")
        elif b > MODELLED:
            out += [t for first, t in NEWER if b >= first]
        return out

    def warning(self) -> str | None:
        """The warning to give once, when the log's build is not the modelled one; None otherwise or
        after the first call that returned it."""
        if self.warned:
            return None
        b = self.build if self.build is not None else (self.hi if self.hi is not None and self.hi < MODELLED
                                                       else None)
        if b is None or b == MODELLED:
            return None
        self.warned = True
        what = "; ".join(self.differs()) or "no known difference in what slotlab reads"
        who = name(self.build) if self.build is not None else f"a build before b{self.hi + 1}"
        return (f"slotlab watch: this log is from {who}, slotlab models b{MODELLED}: {what}")

    def summary(self) -> dict:
        """The build as `slotlab watch --json` reports it."""
        return {"build": self.build, "commit": self.commit, "source": self.source,
                "range": [self.lo, self.hi] if self.build is None else [self.build, self.build],
                "modelled": MODELLED, "cannot_give": missing(self.assumed()), "differs": self.differs()}

    def line(self) -> str:
        """One line for the text report."""
        if self.build is not None:
            via = {"commit": f", from its commit {self.commit}", "GET /props": ", from GET /props"}.get(self.source, "")
            head = f"build: reads b{self.build}{via} (slotlab models b{MODELLED})"
        else:
            hi = f"b{self.hi}" if self.hi is not None else f"b{NEWEST} or later"
            head = (f"build: not named in this log (no -lv 4 start-up line); its texts fit b{self.lo}..{hi} "
                    f"(slotlab models b{MODELLED})")
        lack = missing(self.assumed())
        return head + (f"; this build's log cannot give: {'; '.join(lack)}" if lack else "")
