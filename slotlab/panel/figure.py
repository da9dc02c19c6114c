"""The panel's figure as data: the arrays of its three plots, computed from a `PanelState` alone.

Why a separate, pure function: the live panel (`view.Panel`, a plotly FigureWidget) and its static
picture (`static.panel_figure`, matplotlib, committed in the notebooks so it shows with no kernel)
must draw the SAME thing. Both take these arrays; neither computes its own. Nothing here needs
ipywidgets or plotly, and nothing here mutates the state.

The three plots:
1. slot token timelines: one horizontal bar per provenance span of each slot's tokens (kept, restored
   from a RAM-cache entry, from a slot file, from a checkpoint, shifted, prefilled, generated), and a
   red tick where the request first differed from what the slot held;
2. the checkpoint chain: each checkpoint's [pos_min, pos_max], the SWA window (the last n_swa
   positions of the slot), the slot's n_past, and the last checkpoint events (created / restored /
   evict / none) at the n_tokens they concern;
3. evictions by reason against their time (seconds since the engine started; the time travels with
   each event, so a state rebuilt from a trimmed log draws the same): RAM-cache entries dropped, slots
   cleared; one mark per time and reason, with how many.

Legends name only what is drawn (`legend_entries`), each entry once: plot 1's colours are where a
slot's tokens came from, plot 2's marks are checkpoints and the window."""

from __future__ import annotations

from dataclasses import dataclass, field

from slotlab.panel.state import EVICTION_REASONS, PROVENANCE, PanelState, SlotView
from slotlab.palette import COLORS  # noqa: F401  (the provenance colours; read here by the panel's users)
from slotlab.units import MIB

DIVERGENCE_COLOR = "red"
#: the SWA window band, RGBA (0-255 channels, alpha 0-1)
WINDOW_RGBA = (150, 150, 150, 0.25)
CHECKPOINT_COLOR = "#9d755d"
N_PAST_COLOR = "black"
#: checkpoint events: kind -> (plotly marker symbol, colour); anything else is UNKNOWN_MARK
CHECKPOINT_MARKS = {"created": ("triangle-up", "#2ca02c"), "restored": ("star", "#1f77b4"),
                    "evict": ("x", "#d62728"), "none": ("circle-open", "#7f7f7f")}
UNKNOWN_MARK = ("circle", "#888")
#: how many of the last checkpoint events are marked
N_CHECKPOINT_MARKS = 24
#: colour of each eviction reason
EVICTION_COLORS = dict(zip(EVICTION_REASONS, ("#e45756", "#f58518", "#eeca3b", "#4c78a8", "#54a24b", "#b279a2",
                                              "#9d755d", "#000000", "#bab0ac")))
UNKNOWN_COLOR = "#888"
TITLES = ("slot token timelines (this request's provenance)",
          "checkpoints [pos_min, pos_max], SWA window and n_past",
          "evictions by reason, over time")
#: the x axis of plot 3
EVICTION_XLABEL = "seconds since the server started"
#: what the legend calls each provenance kind (plot 1): where the slot's tokens came from
PROV_LABELS = {"kept": "kept in the slot", "cache": "loaded from a RAM-cache entry", "file": "restored from a slot file",
               "checkpoint": "restored from a checkpoint", "shifted": "shifted (--cache-reuse)", "prefill": "prefilled",
               "generated": "generated"}
#: what the legend calls the marks of plot 2
CHAIN_LABELS = {"window": "SWA window (last n_swa positions)", "checkpoint": "checkpoint [pos_min, pos_max]",
                "n_past": "n_past (cache_n)", "divergence": "first differing token",
                "created": "checkpoint created", "restored": "checkpoint restored", "evict": "checkpoint erased",
                "none": "no usable checkpoint", "other": "other checkpoint event"}


def window_rgba_css() -> str:
    r, g, b, a = WINDOW_RGBA
    return f"rgba({r},{g},{b},{a})"


@dataclass
class Bars:
    """Horizontal bars: bar j spans [base[j], base[j] + x[j]) on row y[j] (a category such as "slot 0")."""
    x: list = field(default_factory=list)
    y: list = field(default_factory=list)
    base: list = field(default_factory=list)
    hovertext: list = field(default_factory=list)


@dataclass
class Marks:
    """Markers at (x[j], y[j]); `symbol` / `color` per marker when they vary (else empty)."""
    x: list = field(default_factory=list)
    y: list = field(default_factory=list)
    hovertext: list = field(default_factory=list)
    symbol: list = field(default_factory=list)
    color: list = field(default_factory=list)


@dataclass
class FigureData:
    x_range: list  # the token axis of plots 1 and 2: [0, hi]
    slots: list  # the slot categories, "slot 0" first (drawn on top)
    prov: dict  # provenance kind -> Bars, in PROVENANCE order
    divergence: Marks
    window: Bars  # no hover text
    checkpoints: Bars
    n_past: Marks
    checkpoint_events: Marks
    evictions: Marks
    reasons: tuple = EVICTION_REASONS  # the categories of plot 3


def slot_label(i: int) -> str:
    return f"slot {i}"


def _slot(st: PanelState, i: int) -> SlotView:
    return st.slots.get(i) or SlotView(i)


def x_range(st: PanelState) -> list:
    """Zoom the token axis to what the slots hold (capped at n_ctx_slot), so short prompts show."""
    hi = max([64] + [sv.n_tokens for sv in st.slots.values()] + [sv.n_prompt for sv in st.slots.values()])
    return [0, min(max(st.n_ctx_slot, 1), int(hi * 1.15) + 1)]


def timelines(st: PanelState) -> tuple[dict, Marks]:
    """Plot 1: provenance kind -> Bars, and the divergence ticks."""
    per = {k: Bars() for k in PROVENANCE}
    div = Marks()
    for i in range(st.n_slots):
        sv = _slot(st, i)
        y = slot_label(i)
        for a, b, kind in sv.prov:
            if b <= a:
                continue
            bars = per[kind]
            bars.x.append(b - a)
            bars.y.append(y)
            bars.base.append(a)
            bars.hovertext.append(f"{y} · {kind} [{a}, {b}) · {b - a} tokens · task {sv.task} · {sv.state}<br>"
                                  f"n_past {sv.n_past} · cache_n {sv.n_past} · prompt_n {sv.prompt_n} · origin {sv.origin}")
        if sv.divergence >= 0 and sv.task >= 0:
            div.x.append(sv.divergence)
            div.y.append(y)
            div.hovertext.append(f"{y}: first differing token at {sv.divergence}: {sv.div_text!r}")
    return per, div


def checkpoint_chain(st: PanelState) -> tuple[Bars, Bars, Marks, Marks]:
    """Plot 2: the SWA window, the checkpoints, n_past and the last checkpoint events."""
    win, ck, npast = Bars(), Bars(), Marks()
    for i in range(st.n_slots):
        sv = _slot(st, i)
        y = slot_label(i)
        if st.n_swa and sv.n_tokens:
            lo = max(0, sv.n_tokens - st.n_swa)
            win.x.append(sv.n_tokens - lo)
            win.y.append(y)
            win.base.append(lo)
        for pmin, pmax, n_tok, size, task in sv.checkpoints:
            ck.x.append(max(1, pmax - pmin + 1))
            ck.y.append(y)
            ck.base.append(pmin)
            ck.hovertext.append(f"{y} checkpoint [{pmin}, {pmax}] · n_tokens {n_tok} · {size / MIB:.2f} MiB · task {task}")
        if sv.task >= 0:
            npast.x.append(sv.n_past)
            npast.y.append(y)
    marks = [m for m in list(st.ckpt_marks)[-N_CHECKPOINT_MARKS:] if m[1] >= 0]
    ev = Marks(x=[m[4] if m[4] is not None else 0 for m in marks],
               y=[slot_label(m[1]) for m in marks],
               hovertext=[f"event #{m[0]}: checkpoint {m[2]}" + (f" ({m[3]})" if m[3] else "")
                          + (f" at n_tokens {m[4]}" if m[4] is not None else "") for m in marks],
               symbol=[CHECKPOINT_MARKS.get(m[2], UNKNOWN_MARK)[0] for m in marks],
               color=[CHECKPOINT_MARKS.get(m[2], UNKNOWN_MARK)[1] for m in marks])
    return win, ck, npast, ev


def evictions(st: PanelState) -> Marks:
    """Plot 3: one mark per time (to the millisecond) and reason, on the reason's row; `symbol` holds how
    many evictions the mark stands for (the static picture writes counts above 1 beside it)."""
    groups: dict = {}
    for seq, t, reason, n_tokens, slot in st.evictions:
        g = groups.setdefault((round(t, 3), reason), [])
        g.append((seq, n_tokens, slot))
    m = Marks()
    for (t, reason), g in groups.items():
        m.x.append(t)
        m.y.append(reason)
        what = ", ".join(f"{n} tokens" + (f" (slot {s})" if s >= 0 else "") for _, n, s in g)
        m.hovertext.append(f"at {t:.3f} s: {len(g)} x {reason}: {what} · event #{g[0][0]}"
                           + (f"-{g[-1][0]}" if len(g) > 1 else ""))
        m.symbol.append(len(g))
        m.color.append(EVICTION_COLORS.get(reason, UNKNOWN_COLOR))
    return m


def legend_entries(d: FigureData) -> tuple[list, list]:
    """(plot 1, plot 2): the legend entries of what `d` draws, as (key, label) pairs in drawing order;
    key is a provenance kind (plot 1) or a CHAIN_LABELS key (plot 2)."""
    one = [(k, PROV_LABELS.get(k, k)) for k in d.prov if d.prov[k].x]
    if d.divergence.x:
        one.append(("divergence", CHAIN_LABELS["divergence"]))
    two = [(k, CHAIN_LABELS[k]) for k, b in (("window", d.window), ("checkpoint", d.checkpoints), ("n_past", d.n_past))
           if b.x]
    drawn = set(zip(d.checkpoint_events.symbol, d.checkpoint_events.color))
    two += [(k, CHAIN_LABELS[k]) for k, sc in CHECKPOINT_MARKS.items() if sc in drawn]
    if drawn - set(CHECKPOINT_MARKS.values()):
        two.append(("other", CHAIN_LABELS["other"]))
    return one, two


def figure_data(st: PanelState) -> FigureData:
    """Every array of the panel's figure for state `st` (pure: `st` is not changed)."""
    prov, div = timelines(st)
    win, ck, npast, cev = checkpoint_chain(st)
    return FigureData(x_range=x_range(st), slots=[slot_label(i) for i in range(max(st.n_slots, 1))], prov=prov,
                      divergence=div, window=win, checkpoints=ck, n_past=npast, checkpoint_events=cev,
                      evictions=evictions(st))
