"""The conversation timeline as a static picture: per conversation, each call a horizontal bar of its
prompt — reused (cache_n), then what it processed (prompt_n) by cause: the client's change (hatched, its
kind's colour), the server mechanism that lost a prefix it held (solid, slotlab.explain's cause colour),
and new tokens. An agent's run reads top to bottom; a bar that turns colour early is a broken prefix.

Draws a `slotlab.timeline.Timeline` (the fold over a replay's events), never numbers typed by hand;
`slotlab report TRACE --png FILE` writes it. Colours from slotlab.palette."""

from __future__ import annotations

from pathlib import Path

from matplotlib.patches import Patch

from slotlab.figures import png
from slotlab.palette import CLIENT_COLORS, CLIENT_HATCH, MISS_COLORS, NEW, REUSED

ROW = 0.3  # inches a call
GAP = 1.0  # rows between conversations (the conversation's name sits there)


def part_style(cause: str) -> dict:
    """matplotlib bar keywords of a part (`client:KIND`, `server:CAUSE`, `new`)."""
    side, _, kind = cause.partition(":")
    if side == "client":
        return {"color": CLIENT_COLORS.get(kind, CLIENT_COLORS["other"]), "hatch": CLIENT_HATCH,
                "edgecolor": "white", "linewidth": 0}
    if side == "server":  # outlined: a mechanism's colour never reads as the new tokens' fill
        return {"color": MISS_COLORS.get(kind, MISS_COLORS["other"]), "edgecolor": "#333", "linewidth": 0.6}
    return {"color": NEW}


def legend_label(cause: str) -> str:
    side, _, kind = cause.partition(":")
    return {"client": f"client: {kind}", "server": f"server: {kind}"}.get(side, "new tokens (nothing held them)")


def rows(tl) -> list[tuple[float, object, str | None]]:
    """(y, bar, conversation name on its first call) in drawing order: conversations in the order of
    their first call, GAP rows apart."""
    out, y = [], 0.0
    for s, bars in tl.conversations().items():
        for j, b in enumerate(bars):
            out.append((y, b, s if j == 0 else None))
            y += 1
        y += GAP
    return out


def figure(tl, *, title: str | None = None, width: float = 10.0):
    """The picture of `tl` (a slotlab.timeline.Timeline)."""
    rs = rows(tl)
    if not rs:
        raise ValueError("the timeline has no finished chat call to draw")
    n_conv = sum(1 for _, _, s in rs if s is not None)
    fig, ax = png.new(width, 0.9 + ROW * (len(rs) + GAP * n_conv))
    hi = max(b.cache_n + b.prompt_n for _, b, _ in rs)
    seen: list[str] = []
    for y, b, s in rs:
        ax.barh(y, b.cache_n, color=REUSED, height=0.7)
        left = b.cache_n
        for cause, n in b.parts:
            ax.barh(y, n, left=left, height=0.7, **part_style(cause))
            left += n
            if cause not in seen:
                seen.append(cause)
        c = b.call
        if c is not None and c.change:  # where the prompt diverged, even when the change cost nothing
            kind = f"client:{c.change}"
            x = min(c.position if c.position >= 0 else b.cache_n, b.cache_n + b.prompt_n)
            ax.plot([x], [y - 0.42], marker="v", markersize=6, color=part_style(kind)["color"],
                    markeredgecolor="black", markeredgewidth=0.5, linestyle="none", zorder=3)
            if kind not in seen:
                seen.append(kind)
        what = b.label()
        if what:
            ax.text(left + hi * 0.01, y, what, va="center", fontsize=7.5)
        if s is not None:
            ax.text(0, y - 0.75, f"conversation {s}", va="center", ha="left", fontsize=8.5, fontweight="bold")
    ax.set_yticks([y for y, _, _ in rs], [f"#{b.request}" for _, b, _ in rs], fontsize=8)
    ax.set_ylim(rs[-1][0] + 0.7, -1.3)
    ax.set_xlim(0, hi * 1.55)
    ax.set_xlabel("prompt tokens of each call: reused (cache_n), then processed (prompt_n) by cause; "
                  "▼ where the client's change made the prompt diverge")
    ax.grid(axis="x", color="#ddd", zorder=0)
    ax.set_axisbelow(True)
    order = sorted(seen, key=lambda c: ({"client": 0, "server": 1}.get(c.partition(":")[0], 2), c))
    handles = [Patch(color=REUSED, label="reused (cache_n)")]
    for c in order:
        st = part_style(c)
        handles.append(Patch(facecolor=st["color"], hatch=st.get("hatch"), edgecolor=st.get("edgecolor", st["color"]),
                             linewidth=st.get("linewidth", 0), label=legend_label(c)))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, loc="left")
    return fig


def write_png(tl, path, **kw) -> int:
    """Write the picture; returns its size in bytes."""
    data = png.to_png(figure(tl, **kw))
    Path(path).write_bytes(data)
    return len(data)
