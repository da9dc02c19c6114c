"""Migration: which conversation each slot holds, request after request, and how a conversation
leaves a slot for the RAM prompt cache and comes back in another slot.

Why a picture: the server's log says `saving idle slot to prompt cache`, `clearing prompt with 97
tokens`, `selected slot by LRU` and `found better prompt with f_keep = 0.979` on four separate lines;
only together do they say "the rivers conversation moved from slot 1 to slot 0 through RAM entry #0".
Drawn on one time axis (one column per request), slots as rows on top and RAM-cache entries as lanes
below, each save is an arrow slot -> entry (idle-slot save, or the chosen slot's save at selection) and
each load an arrow entry -> slot: a conversation that comes back in another slot has migrated. In unified
mode (`-kvu`, the default with auto `-np`) the idle slot is also cleared (its bar ends with a cross); not
unified, the idle slot is only copied and keeps its bar.

Everything is read from the engine's events (`task_queued`, `task_launched`, `prompt_plan`,
`cache_alloc`, `cache_loaded`, `cache_evict`, `slot_clear`, `task_done`): `timeline(events)` folds them,
`migrations(...)` lists the moves a notebook asserts, `migration_figure(...)` draws the same timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from slotlab.figures import png

#: arrow colours: a save into the RAM cache (idle-slot save / save at selection) and a load into a slot
IDLE_SAVE = "#1f77b4"
SELECT_SAVE = "#7f7f7f"
LOAD = "#2ca02c"
#: conversation colours, in order of appearance
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d", "#bab0ac",
           "#ff9da6")
#: the events whose order places things inside a request's column
_PLACED = {"task_launched", "cache_alloc", "cache_loaded", "cache_evict", "slot_clear"}


@dataclass
class Request:
    task: int
    x: float  # the column's left edge (request index)
    slot: int = -1
    cache_n: int | None = None
    n_prompt: int | None = None
    conv: str = ""


@dataclass
class Span:
    """A slot's content (`lane` = the slot) or a RAM entry (`lane` = its drawing lane), over [x0, x1)."""

    lane: int
    x0: float
    x1: float | None
    conv: str
    end: str = ""  # why it ended: idle_clear, purge, overwritten, loaded, make_room, ... ("" = still there)
    entry_id: int = -1
    n_tokens: int = 0


@dataclass
class Move:
    """A save (slot -> entry) or a load (entry -> slot) at x."""

    x: float
    kind: str  # "idle_save", "select_save", "load"
    slot: int
    entry_id: int
    conv: str


@dataclass
class Timeline:
    n_slots: int = 0
    kv_unified: bool = False
    flags: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # Request, in arrival order
    slots: list = field(default_factory=list)  # Span per slot content
    entries: list = field(default_factory=list)  # Span per RAM entry (lane: packed drawing lane)
    moves: list = field(default_factory=list)  # Move
    n_lanes: int = 0


def _letters():
    i = 0
    while True:
        yield chr(ord("A") + i % 26) + ("" if i < 26 else str(i // 26))
        i += 1


def timeline(events, names: dict | None = None) -> Timeline:
    """Fold `events` (an Engine, its EventBus, or a list of events) into a Timeline.

    A request's conversation is `names[task]` if given, else the conversation of what it reused (the
    slot's content, or the RAM entry loaded into the slot) when it kept at least half of it (`n_past`
    >= half the tokens held: a shared system prompt alone does not make two users one conversation),
    else a new one (A, B, C, ...)."""
    if hasattr(events, "events"):
        events = events.events
    if hasattr(events, "replayable"):
        events = events.replayable()
    events = list(events)
    names = dict(names or {})
    tl = Timeline()
    letters = _letters()
    # the x of each placed event: column k, then evenly spaced inside it in event order
    col, per_col, placed = -1, {}, {}
    for e in events:
        if e.kind == "task_queued":
            col += 1
            tl.requests.append(Request(e.task, float(col)))
        elif e.kind in _PLACED and col >= 0:
            per_col.setdefault(col, []).append(e.seq)
    for c, seqs in per_col.items():
        for i, s in enumerate(seqs):
            placed[s] = c + (i + 1) / (len(seqs) + 1)
    by_task = {r.task: r for r in tl.requests}
    open_slot: dict[int, Span] = {}
    open_entry: dict[int, Span] = {}
    launch_x: dict[int, float] = {}
    conv_of_task: dict[int, str] = {}
    lanes_free_at: list[float] = []  # per lane, the x its last entry ended (None-free = busy)
    idle_pending: set[int] = set()  # slots whose idle-slot save is under way

    def close_slot(s, x, why):
        sp = open_slot.pop(s, None)
        if sp is not None:
            sp.x1, sp.end = x, why

    def open_(s, x, conv):
        sp = Span(s, x, None, conv)
        open_slot[s] = sp
        tl.slots.append(sp)

    for e in events:
        k, d = e.kind, e.payload
        x = placed.get(e.seq, max(0.0, float(col)))
        if k in ("cache_update_begin", "task_launched"):
            idle_pending.clear()  # idle-slot saves follow a launch; a selection's save follows cache_update_begin
        if k == "init":
            tl.n_slots, tl.kv_unified, tl.flags = d.n_slots, bool(d.kv_unified), list(d.flags or [])
        elif k == "idle_slot_save":
            idle_pending.add(e.slot)
        elif k == "cache_alloc":
            s = d.id_slot
            src = open_slot.get(s)
            conv = src.conv if src is not None else conv_of_task.get(d.id_task, "?")
            kind = "idle_save" if s in idle_pending else "select_save"
            idle_pending.discard(s)
            lane = next((i for i, f in enumerate(lanes_free_at) if f is not None and f <= x), None)
            if lane is None:
                lane = len(lanes_free_at)
                lanes_free_at.append(None)
            lanes_free_at[lane] = None
            sp = Span(lane, x, None, conv, entry_id=d.entry_id, n_tokens=d.n_tokens)
            open_entry[d.entry_id] = sp
            tl.entries.append(sp)
            tl.moves.append(Move(x, kind, s, d.entry_id, conv))
        elif k == "cache_evict":
            sp = open_entry.pop(d.entry_id, None)
            if sp is not None:
                sp.x1, sp.end = x, d.reason
                lanes_free_at[sp.lane] = x
        elif k == "cache_loaded":
            ent = next((sp for sp in reversed(tl.entries) if sp.entry_id == d.entry_id), None)
            conv = ent.conv if ent is not None else "?"
            if ent is not None and ent.end == "loaded":  # the entry leaves the cache as it enters the slot
                x = ent.x1
            close_slot(e.slot, x, "replaced")
            open_(e.slot, x, conv)
            open_slot[e.slot].n_tokens = d.n_tokens
            tl.moves.append(Move(x, "load", e.slot, d.entry_id, conv))
        elif k == "task_launched":
            launch_x[e.task] = x
            if e.task in by_task:
                by_task[e.task].slot = e.slot
        elif k == "prompt_plan":
            cur = open_slot.get(e.slot)
            if e.task in names:
                conv = names[e.task]
            elif cur is not None and d.n_past > 0 and 2 * d.n_past >= cur.n_tokens:
                conv = cur.conv  # it kept at least half of what the slot held: the same conversation
            else:
                conv = next(letters)
            conv_of_task[e.task] = conv
            if e.task in by_task:
                by_task[e.task].conv = conv
            if cur is None or cur.conv != conv:
                lx = launch_x.get(e.task, x)
                close_slot(e.slot, lx, "overwritten")
                open_(e.slot, lx, conv)
        elif k == "slot_clear" and d.n_tokens > 0:
            close_slot(e.slot, x, d.reason)
        elif k == "task_done":
            if e.slot in open_slot:
                open_slot[e.slot].n_tokens = d.tokens_cached
            if e.task in by_task:
                by_task[e.task].cache_n, by_task[e.task].n_prompt = d.cache_n, d.cache_n + d.prompt_n
    tl.n_lanes = len(lanes_free_at)
    return tl


def migrations(tl: Timeline) -> list[tuple[str, int, int, int]]:
    """The moves of a conversation to another slot: (conversation, from slot, RAM entry, to slot), in order."""
    src = {m.entry_id: m.slot for m in tl.moves if m.kind != "load"}
    return [(m.conv, src[m.entry_id], m.entry_id, m.slot) for m in tl.moves
            if m.kind == "load" and m.entry_id in src and src[m.entry_id] != m.slot]



#: inches one character of the 8 pt labels takes (DejaVu Sans, a mean over a label's letters and digits)
_CHAR_IN = 0.075


def _fit(label: str, inches: float) -> str:
    """`label` as it fits in `inches` of its bar: whole, without its "(N tok)" part, or cut with "…" (a bar
    at the right edge is the last column's width, and a label clipped mid-word reads as a bug)."""
    room = int(inches / _CHAR_IN)
    if len(label) <= room:
        return label
    short = label.split(" (", 1)[0]
    if len(short) <= room:
        return short
    return short[: max(1, room - 1)] + "…"


def migration_figure(events, names: dict | None = None, *, title: str | None = None, width: float | None = None):
    """Slots (top rows) and RAM-cache entries (lanes below) against the requests; arrows for saves and
    loads. `events`: an Engine, an EventBus, a list of events or a Timeline; `names`: task -> conversation
    name. `width` in inches (default: about one per request, at least 9)."""
    tl = events if isinstance(events, Timeline) else timeline(events, names)
    n_req = max(1, len(tl.requests))
    width = width or max(9.0, 1.0 * (n_req + 1))
    rows = tl.n_slots + (tl.n_lanes + 1 if tl.n_lanes else 0)
    fig, ax = png.new(width, 1.0 + 0.42 * max(2, rows))
    convs = list(dict.fromkeys([sp.conv for sp in tl.slots] + [sp.conv for sp in tl.entries]))
    color = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(convs)}
    # one more column after the last request: what is still held at the end (slots, RAM entries saved by
    # the last launch) gets room for its bar and label instead of a sliver at the right edge
    end_x = float(n_req) + 1.0
    y_entry0 = tl.n_slots + 1  # first entry lane (one empty row between slots and entries)

    def bar(y, sp, *, hatch=None, label=""):
        x1 = end_x if sp.x1 is None else sp.x1
        ax.add_patch(Rectangle((sp.x0, y - 0.32), max(0.0, x1 - sp.x0), 0.64, facecolor=color[sp.conv],
                               edgecolor="white", hatch=hatch, alpha=0.9 if hatch is None else 0.55, lw=0.8))
        if x1 - sp.x0 > 0.25:
            ax.text(sp.x0 + 0.04, y, _fit(label or sp.conv, (x1 - sp.x0 - 0.04) * width / end_x), va="center",
                    ha="left", fontsize=8, color="black", clip_on=True)
        if sp.end in ("idle_clear", "purge", "load_failed", "decode_failed", "restore_failed", "erase", "clear"):
            ax.plot([x1], [y], marker="x", color="black", ms=7, mew=1.6)
            ax.text(x1 + 0.03, y - 0.38, "purged" if sp.end == "purge" else "cleared", fontsize=7, va="bottom")

    for sp in tl.slots:
        bar(sp.lane, sp)
    for sp in tl.entries:
        bar(y_entry0 + sp.lane, sp, hatch="///", label=f"#{sp.entry_id} {sp.conv} ({sp.n_tokens} tok)")
    lane_of = {sp.entry_id: sp.lane for sp in tl.entries}
    for m in tl.moves:
        ye = y_entry0 + lane_of.get(m.entry_id, 0)
        c = LOAD if m.kind == "load" else IDLE_SAVE if m.kind == "idle_save" else SELECT_SAVE
        top, bottom = (m.x, m.slot + 0.32), (m.x, ye - 0.32)  # the slot's lower edge, the entry's upper edge
        a, b = (bottom, top) if m.kind == "load" else (top, bottom)
        ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="-|>", color=c, lw=1.6, shrinkA=0, shrinkB=0))
    for k in range(n_req + 1):
        ax.axvline(k, color="#e5e5e5", lw=0.8, zorder=0)
    ax.text(n_req + 0.5, -0.55, "held at\nthe end", ha="center", va="bottom", fontsize=7, color="#666")
    if tl.n_lanes:
        ax.axhline(tl.n_slots + 0.5, color="#999", lw=0.8, ls="--")
    ticks = list(range(tl.n_slots)) + [y_entry0 + i for i in range(tl.n_lanes)]
    labels = [f"slot {i}" for i in range(tl.n_slots)] + (["RAM cache"] + [""] * (tl.n_lanes - 1) if tl.n_lanes else [])
    ax.set_yticks(ticks, labels)
    ax.set_ylim(y_entry0 + max(tl.n_lanes, 1) - 0.4 if tl.n_lanes else tl.n_slots - 0.4, -0.6)
    ax.set_xlim(0, end_x)
    ax.set_xticks([r.x + 0.5 for r in tl.requests],
                  [f"task {r.task}\n{r.conv} → slot {r.slot}\ncache_n {r.cache_n}" for r in tl.requests],
                  fontsize=7.5)
    ax.tick_params(length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Line2D([], [], color=IDLE_SAVE, lw=1.6, marker=">", label="idle-slot save (slot → RAM)"),
               Line2D([], [], color=SELECT_SAVE, lw=1.6, marker=">", label="save at selection (slot → RAM)"),
               Line2D([], [], color=LOAD, lw=1.6, marker=">", label="load (RAM → slot; entry removed)"),
               Patch(facecolor="white", edgecolor="#555", hatch="///", label="RAM-cache entry")]
    used = {m.kind for m in tl.moves}
    handles = [h for h, kind in zip(handles, ("idle_save", "select_save", "load", "entry"))
               if kind in used or kind == "entry" and tl.entries]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    mode = ("unified KV (-kvu): idle slots saved and cleared" if tl.kv_unified
            else "not unified: idle slots copied, kept")
    ax.set_title(title or f"{tl.n_slots} slots, {mode}", loc="left")
    return fig


def migration_image(events, names: dict | None = None, **kw):
    """`migration_figure` as an IPython Image (PNG)."""
    return png.image(migration_figure(events, names, **kw))
