"""Reuse heat map: one trace replayed under several flag settings (rows) against its requests (columns),
each cell coloured by where the request's reused prompt came from, or by why it reused nothing.

Why a picture: a table of hit rates says that `--swa-full` beats the defaults; it does not say which
requests hit, nor why the others missed. The map reads both at a glance: a column that is a hit in one
row and a miss in another is a request a flag saves, and the colour names the mechanism — a hit kept
in the slot, a hit loaded from a RAM-cache entry (`found better prompt with f_keep / f_sim`), or a miss
and its cause from `slotlab.explain` (no checkpoint at or before the divergence, so `forced full prompt
re-processing`; the content dropped before the request; the holder below `-sps`; ...). Each cell
carries its `cache_n`, the server's own count of reused prompt tokens.

Everything comes from each run's events (`prompt_plan`, `slot_decision`, `task_done`), folded by
`slotlab.explain.Explainer` as the why lines are: `outcomes(events)` gives the cells a notebook
asserts, `heatmap_figure({setting: events})` draws them."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Patch, Rectangle

from slotlab.explain import CAUSES, Explainer
from slotlab.figures import png
from slotlab.figures.misses import CAUSE_COLORS
from slotlab.palette import COLORS

#: hit categories (where the reused tokens came from: the prompt plan's provenance) and their colours
HITS = {"slot hit": COLORS["kept"], "RAM-cache hit": COLORS["cache"], "file hit": COLORS["file"]}
#: a request that shared nothing with what the server held (nothing to reuse, nothing lost)
NEW = "new prompt"
NEW_COLOR = "#eeeeee"
#: legend text of each miss cause (short: the why line has the long form)
CAUSE_LABELS = {"dropped": "miss: content dropped before (overwritten / cleared / evicted)",
                "busy": "miss: holder busy", "pinned": "miss: id_slot named another slot",
                "threshold": "miss: holder's f_sim not above -sps",
                "slot_kept": "miss: slot kept (f_keep >= 0.50), RAM cache not searched",
                "floor": "miss: entry below the 0.25 f_keep floor", "two_axis": "miss: entry not better on both axes",
                "restore_failed": "miss: RAM entry restore failed",
                "no_checkpoint": "miss: no checkpoint at/before divergence (forced re-processing)",
                "checkpoint_early": "miss: checkpoint too early", "cache_prompt_off": "miss: cache_prompt false",
                "other": "miss: not attributed"}


@dataclass
class Outcome:
    """One request of one run: where its reuse came from or why it missed."""

    task: int
    slot: int
    n_prompt: int
    cache_n: int
    category: str  # "slot hit", "RAM-cache hit", "file hit", a miss cause (slotlab.explain.CAUSES), NEW
    origin: str  # the prompt plan's origin: "slot", "cache #4", "file ..."
    checkpoint: bool  # the reuse went through a checkpoint restore
    lost: int  # reusable tokens lost (0: none)

    @property
    def hit(self) -> bool:
        return self.category in HITS


def _events(src) -> list:
    if hasattr(src, "events"):
        src = src.events
    if hasattr(src, "replayable"):
        src = src.replayable()
    return list(src)


def outcomes(events) -> list[Outcome]:
    """The requests of one run (an Engine, its EventBus or a list of events), in arrival order.

    A request is a hit when it reused more tokens than it lost: coloured by the origin of what it
    reused (its slot's own tokens, a RAM-cache entry, a slot file). Otherwise it is a miss, coloured
    by the cause `slotlab.explain` gives (or `new prompt` when the server held nothing it shared)."""
    evs = _events(events)
    x = Explainer(max_lines=100_000)
    plans, done, order = {}, {}, []
    for e in evs:
        if e.kind == "task_queued":
            order.append(e.task)
        r = x.apply(e)
        if r is not None:
            plans[e.task] = (e.slot, e.payload, r.miss)
        if e.kind == "task_done":
            done[e.task] = e.payload
    out = []
    for t in order:
        if t not in plans or t not in done:
            continue  # a slot action, or a request that failed
        slot, plan, miss = plans[t]
        cache_n = done[t].cache_n
        lost = miss.lost if miss is not None else 0
        origin = str(plan.origin)
        if cache_n > 0 and cache_n >= lost:
            cat = ("RAM-cache hit" if origin.startswith("cache") else "file hit" if origin.startswith("file")
                   else "slot hit")
        else:
            cat = miss.cause if miss is not None else NEW
        out.append(Outcome(t, slot, cache_n + done[t].prompt_n, cache_n, cat, origin, plan.ckpt == "restored",
                           lost))
    return out


def color_of(category: str) -> str:
    return HITS.get(category) or (NEW_COLOR if category == NEW else CAUSE_COLORS.get(category, "#444444"))


def _dark(hex_color: str) -> bool:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 140


def heatmap_figure(runs: dict, labels: list | None = None, *, title: str | None = None, width: float = 10.0,
                   annotate: bool = True):
    """`runs`: setting name -> events (or a list of Outcome); rows in that order. `labels`: one name per
    request (default its index). Cells show `cache_n` when `annotate`; the right margin shows each
    row's share of prompt tokens reused (sum cache_n / sum n_prompt)."""
    rows = {name: (v if isinstance(v, list) and v and isinstance(v[0], Outcome) else outcomes(v))
            for name, v in runs.items()}
    n_col = max([1] + [len(o) for o in rows.values()])
    fig, ax = png.new(width, 0.5 + 0.36 * max(2, len(rows)))
    used = []
    for y, (name, outs) in enumerate(rows.items()):
        for col, o in enumerate(outs):
            c = color_of(o.category)
            ax.add_patch(Rectangle((col, y), 1, 1, facecolor=c, edgecolor="white", lw=1.2))
            if annotate:
                ax.text(col + 0.5, y + 0.5, f"{o.cache_n}" + ("*" if o.checkpoint else ""), ha="center", va="center",
                        fontsize=7.5, color="white" if _dark(c) else "black")
            if o.category not in used:
                used.append(o.category)
        reused, total = sum(o.cache_n for o in outs), sum(o.n_prompt for o in outs)
        ax.text(n_col + 0.15, y + 0.5, f"{reused / max(1, total):.1%}", va="center", fontsize=8)
    ax.set_xlim(0, n_col)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([y + 0.5 for y in range(len(rows))], list(rows))
    labels = labels or [str(i) for i in range(n_col)]
    ax.set_xticks([i + 0.5 for i in range(n_col)], labels[:n_col], fontsize=8, rotation=0)
    ax.tick_params(length=0)
    ax.set_xlabel("requests, in arrival order (cell: cache_n, * = through a checkpoint restore); right: "
                  "share of prompt tokens reused", fontsize=8)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    order = [*HITS, *CAUSES, NEW]
    legend = {**{k: k + (" (kept in the slot)" if k == "slot hit" else " (entry loaded)" if k == "RAM-cache hit"
                         else "") for k in HITS}, **CAUSE_LABELS, NEW: "new prompt (nothing held shares it)"}
    handles = [Patch(facecolor=color_of(c), edgecolor="#999", label=legend.get(c, c))
               for c in sorted(used, key=lambda c: order.index(c) if c in order else len(order))]
    sp = fig.subplotpars
    ax_h = fig.get_figheight() * (sp.top - sp.bottom)  # inches
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.62 / ax_h), ncol=2, fontsize=8,
              frameon=False)  # under the tick labels and the x label
    ax.set_title(title or "where each request's reused prompt came from, or why it missed", loc="left")
    return fig


def heatmap_image(runs: dict, labels: list | None = None, **kw):
    """`heatmap_figure` as an IPython Image (PNG)."""
    return png.image(heatmap_figure(runs, labels, **kw))
