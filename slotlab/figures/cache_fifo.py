"""The RAM prompt cache as a FIFO under its byte budget, one row per `alloc` (spec 2.3 and 2.5).

Why a picture: the server's lines say "making room ... removing oldest entry" or "prompt is already
in the cache, skipping" one at a time; a row of the budget bar per step shows which entry left, from
which end (the oldest, on the left), and that an entry bigger than the whole budget is refused before
anything is evicted. `Recorder` hooks a `PromptCache`'s `on_event` (keeping the hook it had) and
`snap(label)` stores the entries as they are now with the events since the previous snap; `figure`
draws those snapshots. The sizes are the entries' own `size()` and the limit is the cache's
`limit_size`, so the picture shows what the cell asserts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from slotlab.engine import event_types as T
from slotlab.figures import png
from slotlab.units import MIB

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")
REASONS = {"obsolete_prefix": "removed: a prefix of the new prompt", "make_room": "evicted (oldest) to make room",
           "byte_limit": "evicted: over the byte limit", "shrink": "evicted: over the reduced limit",
           "token_limit": "evicted: over the token limit", "loaded": "taken (restored into a slot)",
           "cleared": "cleared"}


@dataclass
class Step:
    label: str
    entries: list  # (id, n_tokens, size) oldest first
    limit_size: int
    events: list = field(default_factory=list)  # (kind, fields) since the previous snap


class Recorder:
    """Records a PromptCache's entries after each step you name (`snap`), with the events in between."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self.steps: list[Step] = []
        self._pending: list = []
        self._prev = cache.on_event

        def hook(kind, **f):
            self._pending.append((kind, f))
            if self._prev is not None:
                self._prev(kind, **f)

        cache.on_event = hook

    def snap(self, label: str) -> Step:
        c = self.cache
        st = Step(label, [(e.id, e.n_tokens(), e.size()) for e in c.entries], c.limit_size, self._pending)
        self._pending = []
        self.steps.append(st)
        return st


def outcome(step: Step, name) -> str:
    """What the step did, in words, from its events."""
    out = []
    for kind, f in step.events:
        if kind == T.CACHE_SKIP_DUPLICATE:
            out.append(f"not cached: a prefix of {name(f['entry_id'])}")
        elif kind == T.CACHE_SKIP_OVER_LIMIT:
            out.append(f"not cached: {f['size'] / MIB:.2f} MiB > the {f['limit_size'] / MIB:.2f} MiB limit")
        elif kind == T.CACHE_EVICT:
            out.append(f"{name(f['entry_id'])} {REASONS.get(f['reason'], f['reason'])}")
        elif kind == T.CACHE_ALLOC_FAILED:
            out.append("allocation failed")
        elif kind == T.CACHE_LIMIT_REDUCED:
            out.append(f"limit cut to {f['limit_size'] / MIB:.2f} MiB (40 %)")
        elif kind == T.CACHE_ALLOC:
            out.append(f"{name(f['entry_id'])} appended")
    return "; ".join(out) or "no change"


def figure(steps, *, names: Optional[dict] = None, width: float = 10.0):
    """One row per `Step` (top = first): the budget `[0, limit_size)` as an outline, the entries as
    segments in FIFO order (oldest on the left, the next evicted), named by `names` (entry id -> name,
    default `#id`), and what the step did on the right."""
    steps = list(steps)
    names = names or {}
    name = lambda i: names.get(i, f"#{i}")  # noqa: E731
    colors: dict = {}
    fig, ax = png.new(width, 0.55 + 0.42 * max(1, len(steps)))
    hi = max([1] + [s.limit_size for s in steps] + [sum(e[2] for e in s.entries) for s in steps]) / MIB
    for row, s in enumerate(steps):
        x = 0.0
        for eid, n_tok, size in s.entries:
            col = colors.setdefault(eid, PALETTE[len(colors) % len(PALETTE)])
            w = size / MIB
            ax.barh(row, w, left=x, height=0.62, color=col, edgecolor="white", lw=1.5, zorder=2)
            ax.text(x + w / 2, row, f"{name(eid)} · {n_tok} tok", ha="center", va="center", fontsize=7.5,
                    color="white", zorder=3)
            x += w
        if s.limit_size:
            ax.barh(row, s.limit_size / MIB, height=0.74, fill=False, edgecolor="#333", lw=1, ls="--", zorder=1)
        ax.text(hi * 1.03, row, outcome(s, name), va="center", fontsize=7.5)
    ax.set_yticks(range(len(steps)), [s.label for s in steps])
    ax.set_ylim(len(steps) - 0.5, -0.5)
    ax.set_xlim(0, hi * 1.9)
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= hi])
    ax.set_xlabel("MiB held (dashed: the byte limit, --cache-ram); oldest entry on the left")
    ax.grid(axis="x", color="#eee", zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def image(steps, **kw):
    return png.image(figure(steps, **kw))
