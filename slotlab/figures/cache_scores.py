"""The RAM prompt cache's choice, drawn on the f_keep × f_sim plane (spec 2.4 and appendix B).

Why a picture: `PromptCache.load` scores every cached prompt against the new one, f_keep = lcp /
entry tokens (how much of the entry the new prompt keeps) and f_sim = lcp / new-prompt tokens (how
much of the new prompt the entry covers), then scans the FIFO oldest first: an entry with f_keep <
0.25 is skipped ("don't trash large prompts"); any other becomes the best only if it beats the
running best on BOTH axes. Printed, that is a column of ratios; on the plane it is a staircase: the
floor is a band on the left, the running best moves up and to the right, and an entry that is better
on one axis only (even far better) lands outside the quadrant it had to reach and loses. The same
entries scanned in another order climb another staircase and can end on another winner (appendix B):
`figure(res_a, res_b)` puts the two scans side by side.

Everything drawn comes from `LoadResult.scores` (the float32 ratios `load` compared) or from the
`cache_load_scores` event an Engine records for each load (the same fields), never from numbers typed
by hand, so the picture matches what the cell asserts."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from slotlab.engine import event_types as T
from slotlab.engine.prompt_cache import F_KEEP_FLOOR, EntryScore, LoadResult
from slotlab.figures import png

SKIPPED = "#9e9e9e"  # below the floor
LOST = "#4c78a8"  # considered, not better on both axes
BEST = "#f58518"  # the best so far at its turn of the scan
WINNER = "#d62728"
REGION = "#54a24b"  # where an entry must land to beat the running best
LIM = 1.08


def load_result(src) -> LoadResult:
    """A `LoadResult`, or the `cache_load_scores` event (or its `data`) that an Engine's load recorded:
    the event keeps the float32 ratios as floats, made float32 again here (exact); entries are not
    kept in events, so `entry` is None and `winner` marks the choice."""
    if isinstance(src, LoadResult):
        return src
    data = getattr(src, "payload", src)
    if isinstance(data, T.CacheLoadScores):
        data = data.as_dict()
    if not isinstance(data, dict) or "scores" not in data:
        raise TypeError(f"need a LoadResult or a cache_load_scores event, not {type(src).__name__}")
    f = np.float32
    scores = tuple(EntryScore(None, d["n_tokens"], d["lcp"], f(d["f_keep"]), f(d["f_sim"]), d["below_floor"],
                              d["improved"], d["winner"]) for d in data["scores"])
    best = [s for s in scores if s.winner]
    fk_best = best[0].f_keep if best else f(data["f_keep_base"])
    fs_best = best[0].f_sim if best else f(data["f_sim_base"])
    return LoadResult(None, data["lcp_base"], f(data["f_keep_base"]), f(data["f_sim_base"]), fk_best, fs_best,
                      scores)


def default_label(k: int, s: EntryScore) -> str:
    """`k`: the entry's place in the scan (1 = scanned first)."""
    return f"{k}: {s.n_tokens} tok"


def legend_handles() -> list:
    return [Line2D([], [], marker="x", ls="", color=SKIPPED, label="skipped (f_keep below the floor)"),
            Line2D([], [], marker="o", ls="", markerfacecolor="none", markeredgecolor=LOST,
                   label="not better than the best so far on both"),
            Line2D([], [], marker="o", ls="", color=BEST, label="best so far (its quadrant dashed)"),
            Line2D([], [], marker="*", ls="", markersize=12, color=WINNER, markeredgecolor="black",
                   label="winner (restored)"),
            Patch(color=REGION, alpha=0.3, label="beats the winner on both axes")]


def draw(ax, res, *, title: str = "", label: Callable[[int, EntryScore], str] = default_label,
         legend: bool = False) -> None:
    """One scan on `ax`: every entry at (f_keep, f_sim), numbered in scan order; the 0.25 floor; the
    running best's path (best so far at each improvement); the winner's "beats both" quadrant.
    `res`: a LoadResult or a `cache_load_scores` event (see `load_result`)."""
    res = load_result(res)
    ax.set_xlim(0, LIM)
    ax.set_ylim(0, LIM)
    ax.set_aspect("equal")
    floor = float(F_KEEP_FLOOR)
    ax.axvspan(0, floor, color=SKIPPED, alpha=0.18, lw=0, zorder=0)
    ax.axvline(floor, color=SKIPPED, lw=1.2, ls="--", zorder=1)
    ax.text(floor / 2, LIM - 0.03, f"f_keep < {floor:g}\nskipped", ha="center", va="top", fontsize=7.5,
            color="#555")
    # the running best: baseline (what the slot holds; off the plane for an empty slot), then each improvement
    path = [(float(res.f_keep_base), float(res.f_sim_base))]
    path += [(float(s.f_keep), float(s.f_sim)) for s in res.scores if s.improved]
    bx, by = float(res.f_keep_best), float(res.f_sim_best)
    if any(s.winner for s in res.scores):  # the region an entry scanned after the winner had to reach
        ax.add_patch(Rectangle((bx, by), LIM - bx, LIM - by, color=REGION, alpha=0.15, lw=0, zorder=0))
        if LIM - bx > 0.3 and LIM - by > 0.15:  # room for the words (else the legend says it)
            ax.text(LIM - 0.02, LIM - 0.03, "beats the winner\non both axes", ha="right", va="top", fontsize=7.5,
                    color=REGION)
    vis = [(x, y) for x, y in path if 0 <= x <= LIM]
    if len(vis) > 1:
        ax.plot(*zip(*vis), color=BEST, lw=1, ls=":", zorder=2)
    for x, y in vis[:-1]:  # each earlier best: the corner of the quadrant the next entries had to reach
        ax.plot([x, x, LIM], [LIM, y, y], color=BEST, lw=0.8, ls="--", zorder=1)
    base = path[0]
    if 0 <= base[0] <= LIM:
        ax.scatter([base[0]], [base[1]], marker="s", s=40, color="black", zorder=3)
        ax.annotate("slot (baseline)", base, textcoords="offset points", xytext=(5, -10), fontsize=7.5)
    else:
        ax.text(floor + 0.02, 0.02, f"baseline: empty slot\n(f_keep {base[0]:g}, f_sim {base[1]:g})",
                fontsize=7.5, color="#555", va="bottom")
    for k, s in enumerate(res.scores, 1):
        x, y = float(s.f_keep), float(s.f_sim)
        if s.below_floor:
            ax.scatter([x], [y], marker="x", s=45, color=SKIPPED, zorder=4)
        elif s.winner:
            ax.scatter([x], [y], marker="*", s=260, color=WINNER, edgecolors="black", linewidths=0.6, zorder=5)
        elif s.improved:
            ax.scatter([x], [y], marker="o", s=55, color=BEST, zorder=4)
        else:
            ax.scatter([x], [y], marker="o", s=55, facecolors="none", edgecolors=LOST, linewidths=1.5, zorder=4)
        ax.annotate(label(k, s), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8,
                    fontweight="bold" if s.winner else "normal")
    ax.set_xlabel("f_keep = lcp / entry tokens")
    ax.set_ylabel("f_sim = lcp / new prompt tokens")
    ax.grid(color="#eee", zorder=0)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title, loc="left")
    if legend:
        ax.legend(handles=legend_handles(), loc="lower right", fontsize=7, frameon=True, framealpha=0.9)


def figure(*results, titles: Optional[Sequence[str]] = None,
           label: Callable[[int, EntryScore], str] = default_label, size: float = 4.2):
    """One panel per `load` result (side by side): e.g. the server's scan, or the same entries scanned
    in two orders. One legend, under the panels."""
    if not results:
        raise ValueError("figure() needs at least one LoadResult")
    titles = list(titles or [""] * len(results))
    fig, axes = png.new(size * len(results), size + 0.5, ncols=len(results), layout="constrained")
    axes = np.atleast_1d(axes)
    for j, (ax, res) in enumerate(zip(axes, results)):
        draw(ax, res, title=titles[j], label=label)
    fig.legend(handles=legend_handles(), loc="outside lower center", ncol=3 if len(results) < 2 else 5,
               fontsize=7.5, frameon=False)
    return fig


def image(*results, **kw):
    """`figure(...)` as an IPython Image (PNG), for a committed notebook."""
    return png.image(figure(*results, **kw))
