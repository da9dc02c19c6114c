"""The live panel's figure as a static picture (matplotlib -> PNG), for the committed notebooks.

Why: the live panel is a widget; a committed notebook shows `Panel(children=...)` in its place on
GitHub, in nbviewer or in VS Code before a kernel starts. `panel_image(eng)` draws the SAME three
plots from the SAME arrays (`slotlab.panel.figure.figure_data`, which the live panel also assigns to
its plotly traces), with the same colours and the same zoom of the token axis, plus a text strip of
the RAM prompt cache (entries in FIFO order, oldest first, and the gauge), so the picture shows what
the cell next to it asserts.

`source`: an Engine (or anything with an `.events` EventBus, e.g. a `slotlab.watch` source), an
EventBus, a `Panel` (its current state, scrubbed or live), or a `PanelState`."""

from __future__ import annotations

import textwrap

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from slotlab.figures import png
from slotlab.llama.build import LLAMA_CPP_BUILD
from slotlab.panel.figure import (CHECKPOINT_COLOR, COLORS, DIVERGENCE_COLOR, EVICTION_XLABEL, N_PAST_COLOR, TITLES,
                                  UNKNOWN_MARK, WINDOW_RGBA, CHECKPOINT_MARKS, FigureData, figure_data, legend_entries)
from slotlab.panel.state import EVICTION_REASONS, PROVENANCE, PanelState
from slotlab.units import MIB

#: plotly marker symbol -> (matplotlib marker, filled)
MARKERS = {"line-ns-open": ("|", True), "triangle-up": ("^", True), "star": ("*", True), "x": ("x", True),
           "circle-open": ("o", False), "circle": ("o", True)}
#: entries per line of the RAM-cache strip
ENTRIES_PER_LINE = 4
#: at most this many entries are listed (the newest are the ones cut: the strip says how many)
MAX_ENTRIES = 16


def panel_state(source) -> PanelState:
    """The PanelState that `source` (see the module docstring) shows now."""
    if isinstance(source, PanelState):
        return source
    st = getattr(source, "state", None)
    if isinstance(st, PanelState):  # a Panel: what it shows (it may be scrubbed back in time)
        return st
    if hasattr(source, "replay"):  # an EventBus
        return PanelState.from_bus(source)
    events = getattr(source, "events", None)
    if events is not None and hasattr(events, "replay"):
        return PanelState.from_bus(events)
    raise TypeError(f"panel_figure needs an Engine, an EventBus, a Panel or a PanelState, not {type(source).__name__}")


def _rgba(c) -> tuple:
    r, g, b, a = c
    return (r / 255, g / 255, b / 255, a)


def short_flags(flags) -> list[str]:
    """The flags as the header shows them: a path by its file name, a temporary directory (the slot save
    path a replay makes) as "(tmp)", so the picture does not change with where it ran."""
    out, prev = [], ""
    for f in flags:
        if prev == "--slot-save-path" and "/tmp" in f:
            f = "(tmp)"
        elif "/" in f and not f.startswith("-"):
            f = f.rstrip("/").rsplit("/", 1)[-1]
        out.append(f)
        prev = f
    return out


def header(st: PanelState, width: int = 130) -> str:
    flags = " ".join(short_flags(st.flags)) or "(server defaults)"
    text = (f"slotlab (models llama.cpp b{LLAMA_CPP_BUILD}) · {st.n_slots} slots · n_ctx_slot {st.n_ctx_slot} · n_swa {st.n_swa} · event #{st.last_seq} · "
            f"{st.n_requests} requests done · {flags}")
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False))


def cache_lines(st: PanelState) -> list[str]:
    """The RAM prompt cache as text: the gauge, then the entries in FIFO order (oldest, next evicted, first)."""
    g = st.gauge
    if not g:
        gauge = "RAM prompt cache: no state yet" if st.cache_ram else "RAM prompt cache disabled (--cache-ram 0)"
    else:
        lim = g["limit_size"]
        gauge = (f"RAM prompt cache: {g['size'] / MIB:.2f} / {'no limit' if not lim else f'{lim / MIB:.0f} MiB'}, "
                 f"{g['n_tokens']} / {g['limit_tokens_cur']} tokens, {g['n_entries']} entries")
    ents = list(st.entries.values())
    if not ents:
        return [gauge + (" (no entries)" if g else "")]
    items = [f"#{e['id']} {e['n_tokens']} tok {e['size'] / MIB:.2f} MiB (slot {e['id_slot']})"
             for e in ents[:MAX_ENTRIES]]
    if len(ents) > MAX_ENTRIES:
        items.append(f"... {len(ents) - MAX_ENTRIES} more")
    lines = [gauge + " · FIFO, oldest (next evicted) first:"]
    for k in range(0, len(items), ENTRIES_PER_LINE):
        lines.append("   " + "  ·  ".join(items[k:k + ENTRIES_PER_LINE]))
    return lines


def _marker(ax, xs, ys, symbol, color, size, **kw):
    mk, filled = MARKERS.get(symbol, ("o", True))
    if filled:
        return ax.scatter(xs, ys, marker=mk, s=size, color=color, zorder=4, **kw)
    return ax.scatter(xs, ys, marker=mk, s=size, facecolors="none", edgecolors=color, zorder=4, **kw)


def _handle(key: str):
    """The legend mark of a `figure.legend_entries` key, drawn as the plot draws it."""
    if key in COLORS:
        return Patch(color=COLORS[key])
    if key == "divergence":
        return Line2D([], [], color=DIVERGENCE_COLOR, marker="|", ls="", markersize=12, mew=2)
    if key == "window":
        return Patch(color=_rgba(WINDOW_RGBA))
    if key == "checkpoint":
        return Patch(color=CHECKPOINT_COLOR)
    if key == "n_past":
        return Line2D([], [], color=N_PAST_COLOR, marker="|", ls="", markersize=12, mew=2)
    sym, col = CHECKPOINT_MARKS.get(key, UNKNOWN_MARK)
    mk, filled = MARKERS[sym]
    return Line2D([], [], color=col, marker=mk, ls="", markerfacecolor=col if filled else "none")


def panel_figure(source, *, width: float = 10.0):
    """A matplotlib Figure of the live panel's three plots for `source`, plus the RAM-cache strip.
    The arrays it draws are on `fig.slotlab_data` (a `figure.FigureData`), its state on `fig.slotlab_state`."""
    st = panel_state(source)
    d: FigureData = figure_data(st)
    n = len(d.slots)
    pos = {s: j for j, s in enumerate(d.slots)}  # slot 0 on top (the axis is inverted)
    present = [r for r in EVICTION_REASONS if r in set(d.evictions.y)]
    present += sorted(set(d.evictions.y) - set(present))
    lines = cache_lines(st)
    h_slots = 0.35 + 0.32 * n
    h_ev = 0.35 + 0.2 * max(1, len(present))
    h_text = 0.17 * len(lines) + 0.1
    fig, axes = png.new(width, 2 * h_slots + h_ev + h_text + 1.6, nrows=4, sharex=False, layout="constrained",
                        gridspec_kw={"height_ratios": [h_slots, h_slots, h_ev, h_text]})
    ax1, ax2, ax3, axt = axes
    # the header wraps at the plot area's width (about 10 characters an inch at 9 pt), not the figure's:
    # the legend sits to the right of the plots, and a longer line ran into it
    fig.suptitle(header(st, int(width * 10)), fontsize=9, x=0.01, ha="left")

    # 1. token timelines by provenance + divergence ticks
    for kind in PROVENANCE:
        b = d.prov[kind]
        if b.x:
            ax1.barh([pos[y] for y in b.y], b.x, left=b.base, height=0.7, color=COLORS[kind], label=kind, zorder=2)
    if d.divergence.x:
        _marker(ax1, d.divergence.x, [pos[y] for y in d.divergence.y], "line-ns-open", DIVERGENCE_COLOR, 500,
                linewidths=2, label="divergence")
    # 2. checkpoint chain: SWA window, checkpoints, n_past, checkpoint events
    if d.window.x:
        ax2.barh([pos[y] for y in d.window.y], d.window.x, left=d.window.base, height=0.7, color=_rgba(WINDOW_RGBA),
                 zorder=1, label="SWA window")
    if d.checkpoints.x:
        ax2.barh([pos[y] for y in d.checkpoints.y], d.checkpoints.x, left=d.checkpoints.base, height=0.35,
                 color=CHECKPOINT_COLOR, zorder=2, label="checkpoint")
    if d.n_past.x:
        _marker(ax2, d.n_past.x, [pos[y] for y in d.n_past.y], "line-ns-open", N_PAST_COLOR, 320, linewidths=2,
                label="n_past")
    ce = d.checkpoint_events
    for kind, (sym, col) in list(CHECKPOINT_MARKS.items()) + [("other", UNKNOWN_MARK)]:
        idx = [j for j in range(len(ce.x)) if (ce.symbol[j], ce.color[j]) == (sym, col)]
        if idx:
            _marker(ax2, [ce.x[j] for j in idx], [pos[ce.y[j]] for j in idx], sym, col, 60,
                    label=f"checkpoint {kind}")
    for ax, title in ((ax1, TITLES[0]), (ax2, TITLES[1])):
        ax.set_title(title, loc="left")
        ax.set_xlim(*d.x_range)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_yticks(range(n), d.slots)
        ax.grid(axis="x", color="#ddd", zorder=0)
    ax1.set_xlabel("token position (n_tokens)", labelpad=1)
    ax2.set_xlabel("token position (pos_min … pos_max, n_past)", labelpad=1)
    # 3. evictions by reason, over time (one mark per time and reason; a count beside it when above 1)
    ax3.set_title(TITLES[2], loc="left")
    if present:
        rp = {r: j for j, r in enumerate(present)}
        ev = d.evictions
        ax3.scatter(ev.x, [rp[r] for r in ev.y], c=ev.color, s=30, zorder=3)
        for x, r, n in zip(ev.x, ev.y, ev.symbol):
            if n > 1:
                ax3.annotate(f"x{n}", (x, rp[r]), xytext=(4, 3), textcoords="offset points", fontsize=7, color="#444")
        ax3.set_yticks(range(len(present)), present)
        ax3.set_ylim(-0.6, len(present) - 0.4)
        # from the server's start: one eviction, or a burst, no longer gets an axis a few milliseconds wide
        hi = max(ev.x)
        ax3.set_xlim(0, max(hi * 1.05, hi + 0.01))
        ax3.grid(axis="x", color="#ddd", zorder=0)
        ax3.set_xlabel(EVICTION_XLABEL, labelpad=1)
    else:
        ax3.set_yticks([])
        ax3.set_xticks([])
        ax3.text(0.5, 0.5, "no evictions yet", ha="center", va="center", transform=ax3.transAxes, color="#666")
    # the RAM-cache strip
    axt.axis("off")
    axt.text(0, 1, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=8, transform=axt.transAxes)
    # one legend at the right, of what plots 1 and 2 drew (nothing else, each entry once), under two headings
    one, two = legend_entries(d)
    handles, labels = [], []
    for heading, entries in (("plot 1, where the tokens came from:", one), ("plot 2, checkpoints:", two)):
        if entries:
            if handles:
                handles.append(Line2D([], [], ls="", marker=""))
                labels.append(" ")
            handles.append(Line2D([], [], ls="", marker=""))
            labels.append(heading)
            handles += [_handle(k) for k, _ in entries]
            labels += [lab for _, lab in entries]
    if handles:
        fig.legend(handles=handles, labels=labels, loc="outside right upper", fontsize=8, frameon=False,
                   handletextpad=0.6)
    fig.slotlab_data = d
    fig.slotlab_state = st
    return fig


def panel_png(source, **kw) -> bytes:
    """The picture as PNG bytes (deterministic; under `png.MAX_BYTES`)."""
    return png.to_png(panel_figure(source, **kw))


def panel_image(source, **kw):
    """`panel_image(eng)`: an IPython Image of the panel's figure, for a committed notebook."""
    from IPython.display import Image

    return Image(panel_png(source, **kw), format="png")
