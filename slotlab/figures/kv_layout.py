"""What a slot is, in memory: one `llama_context`, one sequence per slot, and the positions each holds.

Why a picture: `-np 2 -c 4096` reads as two numbers, but what it builds is spatial. Without `-kvu`
each slot's sequence gets its own KV stream of `n_ctx / n_parallel` cells (`n_ctx_seq`); a slot's
tokens occupy positions `[pos_min, pos_max]` of its stream, and on a sliding-window model (Gemma 3:
`n_swa` 512) the SWA layers keep only the last `n_swa` of those. A short prompt is a sliver of its
stream, which is why the RAM prompt cache and slot saves are cheap for short prompts. Copying a slot's
state into another slot (`llama_state_seq_get_data_ext` / `set_data_ext`, what the RAM cache and a
migration do) makes the second slot hold the same positions.

The data are the context's own: `seq_pos_min` / `seq_pos_max` per sequence and the size of
`state_seq_get` (the bytes a RAM-cache entry would hold), taken with `snapshot(ctx)`."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Patch

from slotlab.figures import png
from slotlab.units import MIB

HELD = "#4c78a8"  # the panel's "kept" colour
WINDOW = (150 / 255, 150 / 255, 150 / 255, 0.35)  # the panel's SWA window band
FREE = "#f0f0f0"


@dataclass(frozen=True)
class SeqView:
    seq: int
    pos_min: int  # -1 when the sequence is empty
    pos_max: int
    nbytes: int  # len(ctx.state_seq_get(seq))

    @property
    def n_tokens(self) -> int:
        return 0 if self.pos_max < 0 else self.pos_max - self.pos_min + 1


def snapshot(ctx, seqs=None) -> list[SeqView]:
    """Each sequence's positions and state size, now (`seqs` default: every slot of the context)."""
    out = []
    for s in range(ctx.n_seq_max) if seqs is None else seqs:
        lo, hi = ctx.seq_pos_min(s), ctx.seq_pos_max(s)
        out.append(SeqView(s, lo, hi, len(ctx.state_seq_get(s)) if hi >= 0 else 0))
    return out


def layout_figure(ctx, stages: dict | None = None, *, title: str | None = None, width: float = 9.0):
    """Top: the context's KV cells to scale (one stream per slot without -kvu, one shared stream with
    it), the cells each slot's tokens use filled. Bottom: zoomed on the positions, each slot at each
    stage (`stages`: label -> `snapshot(ctx)`; default: now), with the SWA window of its last token."""
    stages = stages or {"now": snapshot(ctx)}
    last = list(stages.values())[-1]
    n_swa = ctx.n_swa
    rows = [(label, v) for label, snap in stages.items() for v in snap]
    fig, (top, zoom) = png.new(width, 1.6 + 0.3 * len(rows), nrows=2, layout="constrained",
                               gridspec_kw={"height_ratios": [1.1 if not ctx.kv_unified else 0.6, 0.4 * len(rows)]})
    # to scale: the streams
    if ctx.kv_unified:
        top.barh(0, ctx.n_ctx, color=FREE, edgecolor="#999", height=0.6)
        x = 0
        for v in last:
            top.barh(0, v.n_tokens, left=x, color=HELD, height=0.6)
            x += v.n_tokens
        top.set_yticks([0], [f"one stream ({ctx.n_ctx} cells), shared"])
        top.set_ylim(0.5, -0.5)
    else:
        for v in last:
            top.barh(v.seq, ctx.n_ctx_seq, color=FREE, edgecolor="#999", height=0.6)
            top.barh(v.seq, v.n_tokens, color=HELD, height=0.6)
            top.text(ctx.n_ctx_seq * 0.01 + v.n_tokens, v.seq,
                     f"{v.n_tokens} of {ctx.n_ctx_seq} cells used", va="center", fontsize=8)
        top.set_yticks([v.seq for v in last], [f"slot {v.seq} = seq {v.seq}" for v in last])
        top.set_ylim(len(last) - 0.5, -0.5)
        top.set_xlim(0, ctx.n_ctx_seq)
    top.set_title(f"the KV cache to scale: n_ctx {ctx.n_ctx}, "
                  + ("unified (-kvu)" if ctx.kv_unified else f"{ctx.n_seq_max} streams of n_ctx_seq {ctx.n_ctx_seq}"),
                  loc="left")
    top.set_xlabel("KV cells", labelpad=1)
    # zoomed: positions per slot per stage
    hi = max([64] + [v.pos_max + 1 for _, v in rows])
    for r, (label, v) in enumerate(rows):
        if v.n_tokens:
            if n_swa:
                lo = max(0, v.pos_max + 1 - n_swa)
                zoom.barh(r, v.pos_max + 1 - lo, left=lo, color=WINDOW, edgecolor="#888", height=0.9)
            zoom.barh(r, v.n_tokens, left=v.pos_min, color=HELD, height=0.55)
            zoom.text(v.pos_max + 1 + hi * 0.01, r,
                      f"pos [{v.pos_min}, {v.pos_max}] · {v.n_tokens} tokens · {v.nbytes / MIB:.2f} MiB state", va="center",
                      fontsize=8)
        else:
            zoom.text(hi * 0.01, r, "empty", va="center", fontsize=8, color="#666")
    zoom.set_yticks(range(len(rows)), [f"{label}: slot {v.seq}" if len(stages) > 1 else f"slot {v.seq}"
                                       for label, v in rows])
    zoom.set_ylim(len(rows) - 0.5, -0.5)
    zoom.set_xlim(0, int(hi * 2.2))
    zoom.set_xlabel("position in the slot's sequence (pos_min … pos_max)", labelpad=1)
    zoom.set_title("zoomed on the positions each slot holds", loc="left")
    zoom.grid(axis="x", color="#ddd")
    zoom.set_axisbelow(True)
    handles = [Patch(color=HELD, label="positions held")]
    if n_swa:
        handles.append(Patch(color=WINDOW, label=f"SWA window (last n_swa {n_swa})"))
    handles.append(Patch(facecolor=FREE, edgecolor="#999", label="free cells"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    return fig
