"""Misses: what each request reused, what it lost and why, and the tokens lost by cause.

Why a picture: a why line says "58 of 58 reusable tokens lost"; drawn against the prompt, the reader
sees at once how much of the prompt the server could have skipped (`possible`, the longest common
prefix with what it held), how much it did skip (`n_past`, the server's cache_n), the tokens it
processed again for nothing (lost, coloured by the mechanism that lost them) and the tokens that were
new anyway. The by-cause chart is the totals line of `slotlab watch --why` / `slotlab replay --why`:
the place to start on a real server. Both take `slotlab.explain.Miss` objects (from
`slotlab.counterfactual.diagnose_trace`, `slotlab.watch.report.misses` or an Explainer), never numbers
typed by hand."""

from __future__ import annotations

from matplotlib.patches import Patch

from slotlab.explain import CAUSES
from slotlab.figures import png
from slotlab.palette import MISS_COLORS, NEW, REUSED

#: one colour per miss cause (slotlab.explain.CAUSES order)
CAUSE_COLORS = {c: MISS_COLORS[c] for c in CAUSES}


def requests_figure(misses, *, title: str | None = None, label=None, width: float = 9.0):
    """One bar per missed request over its prompt's tokens: [0, n_past) reused, [n_past, possible)
    lost (coloured by cause, with the count), [possible, n_prompt) new. `misses`: (request index, Miss)
    pairs; `label(i, m)` names a row (default "#i task T (slot S)")."""
    misses = list(misses)
    label = label or (lambda i, m: f"#{i} task {m.task}")
    fig, ax = png.new(width, 0.6 + 0.38 * max(1, len(misses)))
    hi = max([1] + [m.n_prompt for _, m in misses])
    causes = []
    for row, (i, m) in enumerate(misses):
        ax.barh(row, m.n_past, color=REUSED, height=0.6)
        ax.barh(row, m.lost, left=m.n_past, color=CAUSE_COLORS.get(m.cause, "#444"), height=0.6)
        ax.barh(row, max(0, m.n_prompt - m.possible), left=m.possible, color=NEW, height=0.6)
        ax.text(m.n_prompt + hi * 0.01, row, f"{m.lost} lost ({m.cause}), {m.where}", va="center", fontsize=8)
        if m.cause not in causes:
            causes.append(m.cause)
    ax.set_yticks(range(len(misses)), [label(i, m) for i, m in misses])
    ax.set_ylim(len(misses) - 0.5, -0.5)
    ax.set_xlim(0, hi * 1.5)
    ax.set_xlabel("prompt tokens: reused (n_past = cache_n), lost (possible − n_past), new (n_prompt − possible)")
    ax.grid(axis="x", color="#ddd", zorder=0)
    ax.set_axisbelow(True)
    handles = [Patch(color=REUSED, label="reused (n_past)")]
    handles += [Patch(color=CAUSE_COLORS.get(c, "#444"), label=f"lost: {c}") for c in causes]
    handles.append(Patch(color=NEW, label="new tokens"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, loc="left")
    return fig


def by_cause_figure(lost: dict, *, n_logs: dict | None = None, title: str | None = None, width: float = 7.0,
                    log_scale: bool = True):
    """Tokens lost by cause, largest first (`lost`: cause -> tokens, e.g. `Diagnosis.lost_by_cause` or
    the second value of `watch.report.misses`). `n_logs`: cause -> how many logs / traces showed it.
    A log scale by default: one cause often dwarfs the others, and the small ones still cost a request."""
    items = sorted(lost.items(), key=lambda kv: (-kv[1], kv[0]))
    fig, ax = png.new(width, 0.6 + 0.32 * max(1, len(items)))
    ys = range(len(items))
    ax.barh(ys, [n for _, n in items], color=[CAUSE_COLORS.get(c, "#444") for c, _ in items], height=0.6)
    for y, (c, n) in zip(ys, items):
        extra = f" in {n_logs[c]} logs" if n_logs and c in n_logs else ""
        ax.text(n * (1.08 if log_scale else 1.0) + (0 if log_scale else 1), y, f"{n}{extra}", va="center", fontsize=8)
    ax.set_yticks(list(ys), [c for c, _ in items])
    ax.set_ylim(len(items) - 0.5, -0.5)
    top = max([1] + [n for _, n in items])
    if log_scale:
        ax.set_xscale("log")
        ax.set_xlim(1, top * 12)
        ax.set_xlabel("tokens lost (processed again although the server held them; log scale)")
    else:
        ax.set_xlim(0, top * 1.3)
        ax.set_xlabel("tokens lost (processed again although the server held them)")
    ax.grid(axis="x", color="#ddd", zorder=0)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title, loc="left")
    return fig
