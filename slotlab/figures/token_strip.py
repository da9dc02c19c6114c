"""`--cache-reuse` as a before / after token strip: what the slot held, what the new prompt reuses and
where each reused chunk moved (spec 3.4).

Why a picture: the server reports a shift as one log line, `reusing chunk with size 230, shifting KV
cache [181, 411) -> [91, 321)`. The llama.cpp docs explain it with letters: the cache holds `AAABCCCC`,
the new prompt is `AAACCCC`, so the server keeps `AAA`, drops `B` and shifts `CCCC` left. The strip
draws that. The top row is the slot before the request: the common prefix is kept, the cells between
chunks are dropped (`seq_rm`) and the chunks are moved (`seq_add` by a negative delta). The bottom row
is the new prompt: the kept prefix, the chunks at their new positions, and the tokens prefilled from
`n_past` on. A band joins each chunk's old and new place and is labelled with the shift.

The data is the engine's. The request's `prompt_plan` event gives the common prefix, the shifts,
`n_past` and the prompt length. The tokens the slot held come from `slotlab.figures.checkpoints.rewind`,
which reads the same events."""

from __future__ import annotations

from slotlab.figures import png
from slotlab.figures.checkpoints import Rewind, rewind

KEPT = "#4c78a8"
SHIFTED = "#eeca3b"
DROPPED = "#bab0ac"
PREFILL = "#f58518"


def segments(r: Rewind) -> tuple[list, list]:
    """The two rows as spans `(start, end, role)`. Roles are `kept`, `dropped`, `chunk` (its old place),
    `shifted` (its new place, up to n_past) and `prefill`. The slot row covers [0, n_held); the prompt
    row covers [0, n_prompt)."""
    before, after = [], []
    if r.lcp > 0:
        before.append((0, r.lcp, "kept"))
        after.append((0, min(r.lcp, r.n_past), "kept"))
    cur = r.lcp
    for a, b, c, d in r.shifts:
        if a > cur:
            before.append((cur, a, "dropped"))
        before.append((a, b, "chunk"))
        if c < r.n_past:
            after.append((c, min(d, r.n_past), "shifted"))
        cur = b
    if r.n_held > cur:
        before.append((cur, r.n_held, "dropped"))
    after.append((r.n_past, r.n_prompt, "prefill"))
    return before, after


def draw(ax, r: Rewind, title: str | None = None) -> None:
    from matplotlib.patches import Patch, Polygon

    colors = {"kept": KEPT, "dropped": DROPPED, "chunk": SHIFTED, "shifted": SHIFTED, "prefill": PREFILL}
    before, after = segments(r)
    y_b, y_a, h = 1.0, 0.0, 0.32
    span = max(1, r.n_held, r.n_prompt)
    for y, row in ((y_b, before), (y_a, after)):
        for a, b, role in row:
            if b <= a:
                continue
            ax.barh(y, b - a, left=a, height=2 * h, color=colors[role], edgecolor="black", linewidth=0.5,
                    hatch="//" if role == "dropped" else None)
            if (b - a) >= 0.07 * span:
                ax.text((a + b) / 2, y, f"[{a}, {b})", ha="center", va="center", fontsize=7)
            else:  # too narrow to hold its label: write it beside the bar
                ax.text(b, y + (h if y == y_b else -h) * 1.15, f"[{a}, {b})", ha="center",
                        va="bottom" if y == y_b else "top", fontsize=6)
    for a, b, c, d in r.shifts:
        ax.add_patch(Polygon([(a, y_b - h), (b, y_b - h), (d, y_a + h), (c, y_a + h)], closed=True,
                             facecolor=SHIFTED, alpha=0.35, edgecolor="none"))
        ax.text((a + b + c + d) / 4, 0.5, f"shift {c - a:+d}", ha="center", va="center", fontsize=8)
    hi = max(r.n_held, r.n_prompt)
    ax.text(0, y_b + h + 0.05, f"slot held {r.n_held} tokens", ha="left", va="bottom", fontsize=7)
    ax.text(0, y_a - h - 0.05, f"new prompt {r.n_prompt} tokens: cache_n {r.n_past}, prompt_n {r.n_prompt - r.n_past}",
            ha="left", va="top", fontsize=7)
    ax.set_yticks([y_a, y_b])
    ax.set_yticklabels(["new prompt", "slot before"])
    ax.set_ylim(-0.75, 1.75)
    ax.set_xlim(0, hi * 1.06 + 1)
    ax.set_xlabel("token position")
    shifted = sum(b - a for a, b, _, _ in r.shifts)
    ax.set_title(title or f"task {r.task}, slot {r.slot}: common prefix {r.lcp} kept, {len(r.shifts)} chunk(s) of "
                          f"{shifted} tokens shifted, n_past {r.n_past}", fontsize=8, loc="left")
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    handles = [Patch(facecolor=KEPT, label="common prefix (kept)"),
               Patch(facecolor=DROPPED, hatch="//", label="dropped (seq_rm)"),
               Patch(facecolor=SHIFTED, label="chunk shifted (seq_add)"),
               Patch(facecolor=PREFILL, label="prefilled from n_past")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def figure(engine, task: int | None = None, title: str | None = None, width: float = 9.0):
    """The strip of `task` (default: the latest request) as a PNG image for the notebook."""
    fig, ax = png.new(width, 2.2)
    draw(ax, rewind(engine, task), title)
    fig.tight_layout()
    return png.image(fig)
