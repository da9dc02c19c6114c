"""`slotlab whatif --proposals` as a picture: llama-server as built, each proposal, the ideal caches.

Why a picture: the question is "how far is my server from the best, and which change closes the gap",
a distance read at a glance on bars against the ideal caches' lines, not in a column of digits. One bar
per row of slotlab.proposals.price (its own numbers, never typed in): prompt tokens reused, coloured by
what the row is (the server as built, a proposal verified on a patched llama-server, an unverified
one, an ideal cache), with the prefill time each saves written beside it."""

from __future__ import annotations

from pathlib import Path

from slotlab.figures import png

__all__ = ["overview", "write_png", "write_html", "COLOURS"]

COLOURS = {"server": "#1f77b4", "verified": "#2ca02c", "unverified": "#ff7f0e", "ideal": "#7f7f7f"}


def _colour(r) -> str:
    if r.kind == "proposal":
        return COLOURS["verified" if r.verified else "unverified"]
    return COLOURS[r.kind]


def overview(rows, *, title: str | None = None):
    """A matplotlib figure: one bar a row (percent of the prompt tokens reused)."""
    rows = [r for r in rows if not r.error]
    n = len(rows)
    fig, ax = png.new(9.0, 0.9 + 0.32 * n)
    y = list(range(n))
    for i, r in enumerate(rows):
        ax.barh(i, 100 * r.reuse, color=_colour(r), height=0.7,
                hatch="//" if r.kind == "proposal" and not r.verified else "", edgecolor="white", linewidth=0.0)
        txt = f" {100 * r.reuse:.1f} %"
        if r.kind != "server" and r.prefill_seconds_saved:
            txt += f"  ({r.prefill_seconds_saved:+,.0f} s of prefill)"
        ax.text(100 * r.reuse, i, txt, va="center", fontsize=7)
    base = rows[0]
    ax.axvline(100 * base.reuse, color=COLOURS["server"], ls=":", lw=1)
    labels = [r.name + ("" if r.kind != "proposal" else f"  [{r.origin}]") for r in rows]
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    top = max(100 * r.reuse for r in rows) if rows else 1.0
    ax.set_xlim(0, max(1.0, top) * 1.35)
    ax.set_xlabel("prompt tokens reused (% of the prompt tokens of the requests that succeeded)")
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(axis="y", length=0)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=COLOURS["server"], label="llama-server as built"),
                       Patch(color=COLOURS["verified"], label="proposal, verified on a patched server"),
                       Patch(facecolor=COLOURS["unverified"], hatch="//", edgecolor="white",
                             label="proposal, unverified"),
                       Patch(color=COLOURS["ideal"], label="ideal cache (same memory)")],
              fontsize=7, loc="lower right", framealpha=0.9)
    ax.set_title(title or "llama-server, the changes proposed upstream, and the ideal cache", loc="left")
    return fig


def write_png(rows, path, *, title: str | None = None) -> None:
    Path(path).write_bytes(png.to_png(overview(rows, title=title)))


def write_html(rows, path, *, title: str = "slotlab whatif --proposals") -> None:
    import plotly.graph_objects as go

    rows = [r for r in rows if not r.error]
    fig = go.Figure(go.Bar(
        y=[r.name for r in rows], x=[100 * r.reuse for r in rows], orientation="h",
        marker_color=[_colour(r) for r in rows],
        text=[f"{100 * r.reuse:.1f} %" + (f", {r.prefill_seconds_saved:+,.0f} s" if r.kind != "server" else "")
              for r in rows],
        hovertext=[f"{r.origin}; reused {r.reused:,}, prefilled {r.prefilled:,}" for r in rows]))
    fig.update_layout(title=title, xaxis_title="prompt tokens reused (%)", yaxis=dict(autorange="reversed"),
                      height=200 + 30 * len(rows))
    fig.write_html(str(path), include_plotlyjs="cdn")
