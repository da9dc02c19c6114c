"""The checkpoint rule as a picture: a slot's token axis, its checkpoint chain, the SWA window and the
point the next request cuts the slot back to (spec 3.5).

Why a picture: the server's decision reads as a handful of numbers (`pos_min`, `pos_next`, each
checkpoint's `[pos_min, pos_max]`) and one log line (`forcing full prompt re-processing ...` or
`restored context checkpoint ...`). The rule is spatial. When a request keeps only the first `pos_next`
tokens of a slot, the next token attends to the positions `[pos_next - n_swa, pos_next)`. A memory that
cannot be cut back (Gemma 3's window cache without `--swa-full`) no longer has those states once it has
moved past `pos_next`. So when `pos_min >= pos_min_thold = max(0, pos_next - n_swa)` the server needs a
checkpoint that ends at or before `pos_next` (`pos_max <= pos_next`) and starts early enough
(`pos_min < pos_min_thold` or `pos_min == 0`). It restores the newest such checkpoint; if none fits it
re-processes the whole prompt. With `pos_next <= n_swa` the threshold is 0, so every reuse of a slot
needs a checkpoint, even when the memory still holds every cell.

Each checkpoint is drawn twice: its outline is the `[pos_min, pos_max]` the server records and logs; its
filled bar is the cells its bytes really hold. For a window cache those are only the last `n_swa`
positions, because `state_write` skips the cells the window masks. The server's own note
`[TAG_CHECKPOINTS_FIX_POS_MIN]` says the recorded range is wrong for SWA models.

The data is the engine's, from its events: the request's `prompt_plan`, which holds the slot's
checkpoints before the decision, `pos_min`, `pos_min_thold`, the common prefix and `n_past`. The tokens
the slot held come from the last event that set them (`slot_snapshot`, `task_done`, `cache_loaded`,
`slot_clear`, `slot_restored`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from slotlab.engine import event_types as T
from slotlab.figures import png

#: colours: the checkpoint the server restores, the ones it cannot use, the window band, the cut-back
RESTORED = "#2ca02c"
UNUSABLE = "#bab0ac"
NOT_NEEDED = "#9d755d"
WINDOW = "#9467bd"  # the window band and pos_min_thold
PREFILL = "#f58518"
CUT = "#d62728"
HELD = "#4c78a8"


@dataclass
class Rewind:
    """One request's rewind decision (spec 3.5), read from the engine's events."""

    task: int
    slot: int
    n_held: int  # tokens the slot held when the request started
    n_prompt: int
    lcp: int  # common prefix of what the slot held and the prompt
    pos_next: int  # where the prompt continues before the rewind (lcp + shifted chunks)
    n_past: int  # tokens reused in the end (cache_n)
    n_swa: int
    pos_min: int | None  # the memory's pos_min when the rule was checked (None: not checked)
    pos_min_thold: int
    mode: str | None  # "restored", "forced" or None (no checkpoint needed)
    checkpoints: list = field(default_factory=list)  # (pos_min, pos_max, n_tokens), oldest first
    shifts: list = field(default_factory=list)  # --cache-reuse moves (src0, src1, dst0, dst1)

    @property
    def needs_checkpoint(self) -> bool:
        """`pos_min >= pos_min_thold`: the memory lacks the states the next token needs."""
        return self.pos_min is not None and self.pos_min >= self.pos_min_thold

    def verdict(self, ck) -> str:
        """Why the checkpoint `(pos_min, pos_max, n_tokens)` can or cannot serve this request."""
        pmin, pmax, _ = ck
        if not self.needs_checkpoint:
            return "not needed"
        if pmax > self.pos_next:
            return f"unusable: pos_max {pmax} > pos_next {self.pos_next}"
        if not (pmin < self.pos_min_thold or pmin == 0):
            return f"unusable: pos_min {pmin} >= pos_min_thold {self.pos_min_thold}"
        return "usable"

    @property
    def chosen(self):
        """The checkpoint the server restores: the newest usable one (None when none fits)."""
        if not self.needs_checkpoint:
            return None
        for ck in reversed(self.checkpoints):
            if self.verdict(ck) == "usable":
                return ck
        return None

    def sentence(self) -> str:
        """The decision in one line, in the server's terms."""
        head = (f"task {self.task}, slot {self.slot}: common prefix {self.lcp} of {self.n_held} held, "
                f"pos_next {self.pos_next}")
        if self.pos_min is None:
            return f"{head}; nothing to cut back (n_past 0)"
        rule = f"pos_min {self.pos_min} {'>=' if self.needs_checkpoint else '<'} {self.pos_min_thold}"
        if not self.needs_checkpoint:
            return f"{head}; {rule}: the memory still holds the window, cache_n {self.n_past}"
        c = self.chosen
        if c is None:
            return f"{head}; {rule}: needs a checkpoint, none fits, full re-processing (cache_n 0)"
        return f"{head}; {rule}: checkpoint at n_tokens {c[2]} restored, cache_n {self.n_past}"


def held(pos_min: int, pos_max: int, n_swa: int) -> tuple[int, int]:
    """The positions a checkpoint's bytes hold, inclusive. For a window cache these are the cells the
    window does not mask at `pos_max` (llama_kv_cache::state_write skips the masked ones), whatever
    `pos_min` says."""
    return (max(pos_min, pos_max - n_swa + 1), pos_max) if n_swa > 0 else (pos_min, pos_max)


#: the first u32 of a sequence state blob (llama-context.cpp `io_magic`)
IO_MAGIC = 0xAF143CD8


def stored_cells(data) -> np.ndarray:
    """The positions of the cells a state blob holds, read from its bytes (llama.cpp's format: `io_magic`,
    the seq id, then the first cache's `state_write`: stream count, and per stream the cell count
    and each cell's position, seq-id count and seq ids). For a checkpoint (PARTIAL_ONLY) of a window
    cache that is the window. Assumes one position per cell, which excludes M-RoPE. Raises ValueError
    on bytes in another format (the simulator's paper blobs, say)."""
    b = np.asarray(data, dtype=np.uint8)
    if len(b) < 16:
        raise ValueError("not a llama.cpp sequence state")
    magic, _seq, n_stream = struct.unpack_from("<IiI", b[:12].tobytes())
    if magic != IO_MAGIC:
        raise ValueError(f"not a llama.cpp sequence state (magic {magic:#x})")
    off = 12
    for _ in range(n_stream):
        (n,) = struct.unpack_from("<I", b[off:off + 4].tobytes())
        off += 4
        if n == 0:
            continue
        cells = np.frombuffer(b[off:off + 12 * n].tobytes(), dtype=[("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
        if len(cells) != n or np.any(cells["n_seq"] != 1):
            raise ValueError("cells with other than one sequence id: not a single-sequence state")
        return cells["pos"].astype(np.int64)
    return np.zeros(0, dtype=np.int64)


_HOLDERS = (T.SLOT_SNAPSHOT, T.TASK_DONE, T.CACHE_LOADED, T.SLOT_CLEAR, T.SLOT_RESTORED)


def _n_tokens_after(e) -> int:
    d = e.payload
    if e.kind == T.TASK_DONE:
        return int(d.tokens_cached)
    if e.kind == T.SLOT_CLEAR:
        return 0
    return int(d.n_tokens)


def _n_swa(engine) -> int:
    info = getattr(getattr(engine, "memory", None), "info", None)
    if info is not None:
        return int(info.n_swa)
    for e in engine.events.log:
        if e.kind == T.INIT:
            return int(e.payload.n_swa)
    return 0


def rewind(engine, task: int | None = None) -> Rewind:
    """The rewind decision of `task` (default: the latest request that reached its prompt plan)."""
    log = engine.events.log
    plans = [e for e in log if e.kind == T.PROMPT_PLAN and (task is None or e.task == task)]
    if not plans:
        raise ValueError(f"no prompt_plan event for task {task}")
    p = plans[-1]
    d = p.payload
    n_held = 0
    for e in log:
        if e.seq >= p.seq:
            break
        if e.slot == p.slot and e.kind in _HOLDERS:
            n_held = _n_tokens_after(e)
    shifted = sum(b - a for a, b, _, _ in d.shifts or [])
    pos_next = d.lcp + shifted if d.cache_prompt is not False else 0  # UNSET (a log): on
    return Rewind(task=p.task, slot=p.slot, n_held=n_held, n_prompt=d.n_prompt, lcp=d.lcp, pos_next=pos_next,
                  n_past=d.n_past, n_swa=_n_swa(engine), pos_min=None if d.pos_min is T.UNSET else d.pos_min,
                  pos_min_thold=d.pos_min_thold or 0, mode=d.ckpt,
                  checkpoints=[tuple(c) for c in d.checkpoints or []],
                  shifts=[tuple(x) for x in d.shifts or []])


def draw(ax, r: Rewind, title: str | None = None) -> list:
    """One request on `ax`. Rows from the top: what the slot held (and its `pos_min`), each checkpoint
    (oldest first), then the new prompt split into reused (`cache_n`) and prefilled tokens. A red line
    marks `pos_next`, the point the slot is cut back to. A shaded band marks the window the token there
    needs, and a dotted line marks `pos_min_thold`. Returns the legend's handles."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    chosen = r.chosen
    n_ck = len(r.checkpoints)
    rows = n_ck + 2
    hi = max([r.n_held, r.n_prompt, r.pos_next + 1] + [c[1] + 1 for c in r.checkpoints])
    y = rows - 1
    ax.barh(y, r.n_held, left=0, height=0.5, color=HELD, alpha=0.45, edgecolor=HELD)
    ax.text(r.n_held, y, f" {r.n_held} tokens", va="center", fontsize=7)
    labels = ["slot held" + (f" (pos_min {r.pos_min})" if r.pos_min is not None else "")]
    for i, ck in enumerate(r.checkpoints):
        pmin, pmax, n_tok = ck
        y = rows - 2 - i
        v = r.verdict(ck)
        color = RESTORED if ck is chosen else NOT_NEEDED if v == "not needed" else UNUSABLE
        ax.barh(y, pmax - pmin + 1, left=pmin, height=0.5, fill=False, edgecolor="black", linestyle="--",
                linewidth=0.7)
        lo, hi_ = held(pmin, pmax, r.n_swa)
        ax.barh(y, hi_ - lo + 1, left=lo, height=0.5, color=color, edgecolor="black", linewidth=0.4)
        ax.text(pmax + 1, y, f" holds [{lo}, {hi_}]: {'restored' if ck is chosen else v}", va="center", fontsize=7)
        labels.append(f"ckpt [{pmin}, {pmax}] n_tokens {n_tok}")
    ax.barh(0, r.n_past, left=0, height=0.5, color=RESTORED)
    ax.barh(0, r.n_prompt - r.n_past, left=r.n_past, height=0.5, color=PREFILL)
    ax.text(r.n_prompt, 0, f" cache_n {r.n_past}, prompt_n {r.n_prompt - r.n_past}", va="center", fontsize=7)
    labels.append("new prompt")
    if r.n_swa:
        ax.axvspan(max(0, r.pos_next - r.n_swa), r.pos_next, color=WINDOW, alpha=0.12, lw=0)
        ax.axvline(r.pos_min_thold, color=WINDOW, lw=1.2, ls=":")
    ax.axvline(r.pos_next, color=CUT, lw=1.2)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(list(reversed(labels)), fontsize=7)
    ax.set_ylim(-0.5, rows - 0.5)
    ax.set_xlim(0, hi * 1.6 + 2)
    ax.set_xlabel("token position")
    ax.set_title(title or r.sentence(), fontsize=8, loc="left")
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    handles = [Line2D([], [], color=CUT, lw=1.2, label="pos_next: the slot is cut back to it"),
               Patch(facecolor=WINDOW, alpha=0.2, label="[pos_next - n_swa, pos_next): the window it needs"),
               Line2D([], [], color=WINDOW, lw=1.2, ls=":", label="pos_min_thold = max(0, pos_next - n_swa)"),
               Patch(fill=False, edgecolor="black", ls="--", label="checkpoint's recorded [pos_min, pos_max]"),
               Patch(facecolor=UNUSABLE, edgecolor="black", lw=0.4, label="cells its bytes hold"),
               Patch(facecolor=RESTORED, label="restored checkpoint / reused tokens (cache_n)"),
               Patch(facecolor=PREFILL, label="prefilled (prompt_n)")]
    if not r.n_swa:
        handles = [h for i, h in enumerate(handles) if i not in (1, 2)]
    return handles


def figure(engine, tasks=None, titles=None, width: float = 9.0):
    """The rewind of each task in `tasks` (default: the latest request), one panel each, as a PNG
    image for the notebook (`slotlab.figures.png.image`)."""
    tasks = [None] if tasks is None else list(tasks)
    rs = [rewind(engine, t) for t in tasks]
    heights = [1.2 + 0.3 * (len(r.checkpoints) + 2) for r in rs]
    fig, axes = png.new(width, sum(heights) + 0.35 * len(rs), nrows=len(rs), squeeze=False,
                        gridspec_kw={"height_ratios": heights})
    for i, (ax, r) in enumerate(zip(axes[:, 0], rs)):
        handles = draw(ax, r, titles[i] if titles else None)
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=7, frameon=False)
    return png.image(fig)
