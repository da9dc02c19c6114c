"""What a `LogReader` keeps between lines: the server as its lines left it (each slot, each task, the RAM
cache's FIFO list) and the blocks of lines under way (`UnderWay`), each a typed record.

A server decision takes several lines (a slot selection: `selected slot by id`, the similarity checks,
a RAM-cache update, `processing task`; a save: its size, then the allocation chain; a load: the base,
one score per entry, the winner; a `cache state` listing: one line per entry), so the reader holds
their events until the block ends. `UnderWay` names each block that may be open; `busy()` says whether
any is, and while one is the reader returns no events (they may still change)."""

from __future__ import annotations

from dataclasses import dataclass, field

from slotlab.watch.lines import LogLine


@dataclass
class Spec:
    """An event not yet numbered (held while the lines that complete it are read)."""

    kind: str
    message: str
    level: str
    slot: int
    task: int
    data: dict
    t: float
    new_task: bool = False  # the task is the one being selected: set when `processing task` names it


@dataclass
class PromptStart:
    """A prompt start under way: from `new prompt` to the first `cached n_tokens` (which gives n_past)."""

    lcp: int | None  # the common prefix with the slot, from the selection (None: no line said)
    checkpoints: list  # the slot's checkpoints when the prompt started: (pos_min, pos_max, n_tokens)
    ckpt: str | None = None  # "restored" / "forced": what the checkpoint lines decided
    full_match: int | None = None  # `need to evaluate at least 1 token`: the n_past it cut from
    reuse_n_past: int | None = None  # `trying to reuse chunks ... n_past = N`
    pos_min_thold: int | None = None  # `checking checkpoint with [..] against T`


@dataclass
class SlotState:
    """One slot as the lines left it (`server_slot`)."""

    id: int
    state: str = "idle"
    task: int = -1
    task_prev: int = -1
    n_tokens: int | None = 0  # None: not known (reading started mid-run, or a restore of unknown length)
    n_prompt: int = 0
    n_past: int = 0
    prompt_n: int = 0
    n_gen: int = 0
    origin: str = "slot"
    shifts: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)  # [pos_min, pos_max, n_tokens, size, id_task]
    plan: PromptStart | None = None
    lcp_hint: int | None = None  # lcp with the prompt of the task being launched, from its selection
    sig: tuple | None = None  # the last snapshot's contents (a snapshot is emitted when they change)
    restored: Spec | None = None  # an inferred `slot_restored` whose length a later line may still give


@dataclass
class TaskState:
    """One task (`server_task` of a completion) as the lines showed it."""

    id: int
    slot: int
    n_tokens: int | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    launched: bool = False  # task_launched emitted
    errored: bool = False
    done: bool = False


@dataclass
class Entry:
    """One RAM-cache entry (`server_prompt_cache`'s list), ids in allocation order as the engine's."""

    id: int
    n_tokens: int
    size: int
    size_dft: int
    checkpoints: list  # [pos_min, pos_max, n_tokens, size, id_task]
    id_slot: int = -1
    id_task: int = -1
    addr: str | None = None


@dataclass
class Score:
    """One `   - prompt with length N, lcp = L, f_keep = K, f_sim = F` line of a load."""

    entry_id: int
    n_tokens: int
    lcp: int
    f_keep: float
    f_sim: float
    printed: tuple  # (f_keep, f_sim) as printed, to find the winner `found better prompt` names


@dataclass
class LoadResult:
    """What a load that found a better prompt gives the slot decision."""

    f_keep_best: float
    f_sim_best: float
    f_keep_base: float
    lcp: int

    def decision_fields(self) -> dict:
        return {"f_keep_best": self.f_keep_best, "f_sim_best": self.f_sim_best, "f_keep_base": self.f_keep_base}


@dataclass
class Selection:
    """A slot selection under way (`get_available_slot`, steps A-D, and its RAM-cache update)."""

    specs: list = field(default_factory=list)
    id_requested: int = -1
    seen: set = field(default_factory=set)
    checks: dict = field(default_factory=dict)  # slot -> (lcp, n_task, f_sim)
    n_held: dict = field(default_factory=dict)  # slot -> its length when checked (None: not known)
    scores: list | None = None  # the RAM-cache entries the load listed (Score)
    thold: float | None = None  # -sps, as the similarity lines print it
    chosen: int | None = None
    how: str | None = None
    f_sim_best: float = 0.0
    f_keep: float | None = None  # printed on `selected slot by LCP similarity`
    sps_on: bool = False  # a skip / check line was printed: -sps is not 0
    n_task: int | None = None
    update_cache: bool = False
    load: bool | None = None
    load_result: LoadResult | None = None


@dataclass
class PendingAlloc:
    """A ` - saving prompt with length N` whose allocation chain (skips, evictions, failure) is read."""

    n_tokens: int
    size_tgt: int
    size_dft: int
    id_slot: int
    id_task: int
    checkpoints: list
    line: LogLine
    lru_pos: int | None = None  # --cache-ram-lru (a proposal's server): where the new entry was placed


@dataclass
class PendingLoad:
    """A ` - looking for better prompt` whose score lines and result are read."""

    lcp_base: int
    f_keep_base: float
    f_sim_base: float
    n_task: int | None
    scores: list = field(default_factory=list)  # Score
    winner: int | None = None  # index into scores
    found: tuple | None = None  # (f_keep, f_sim) of `found better prompt`


@dataclass
class PendingListing:
    """A ` - cache state: N prompts, ...` line whose N entry lines are read."""

    line: LogLine
    level: str
    n: int
    size: int
    limit_size: int
    limit_tokens: int
    est: int
    rows: list = field(default_factory=list)  # (addr, n_tokens, n_checkpoints, size, line, level)


@dataclass
class AwaitPrompt:
    """A launch waiting for its slot's `new prompt` line (the prompt length its ratios need)."""

    slot: int
    task: int
    n_lines: int = 0


@dataclass
class UnderWay:
    """The blocks of lines under way: each holds events a later line may still change."""

    selection: Selection | None = None
    idle_slot: int | None = None  # the idle slot being saved to the RAM cache / cleared
    cache_ctx: tuple = (-1, -1)  # (slot, task) of the RAM-cache call under way
    alloc: PendingAlloc | None = None
    load: PendingLoad | None = None
    listing: PendingListing | None = None
    new_entries: dict = field(default_factory=dict)  # entry id -> its cache_alloc Spec, until a listing gave its size
    pending_clear: Spec | None = None  # a clear outside any context: an erase, or a failed restore
    await_prompt: AwaitPrompt | None = None
    fixes: list = field(default_factory=list)  # callables(n_prompt) run when the prompt length is known

    def busy(self) -> bool:
        return (self.selection is not None or self.idle_slot is not None or self.alloc is not None
                or self.load is not None or self.listing is not None or bool(self.new_entries)
                or self.pending_clear is not None or self.await_prompt is not None)

