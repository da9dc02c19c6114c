"""The event schema: every event kind the engine emits, its fields, what they mean.

An `Event` (slotlab.engine.events) is an envelope: `seq, t, kind, level, message, slot, task` plus a
`payload`, an instance of its kind's class here. Each kind has one frozen dataclass, grouped in
families (a base class per family), each field documented. Every producer (the engine, the RAM-cache
glue, the simulator, the log reader, serve) builds the payload itself: `emit(T.TaskLaunched(n_tokens=12),
"processing task", slot=s)`, so the constructor is the schema check (a missing or unknown field is a
`TypeError` at the emit site), and every reader (the panel, the explainer, serve, replay, metrics)
reads attributes. It is the contract they share:

* kind names as constants (`SLOT_SNAPSHOT`, `CACHE_ALLOC`, ...): import them instead of writing strings;
  a payload class's `KIND` is its kind, and `Event.kind` is that of its payload;
* `REGISTRY`: kind -> payload class; `FAMILIES`: family name -> kinds;
* `Payload.to_json()`: the JSON of an event's `data` (what `--events` files and serve write);
* `RETAIN`: which events define the current picture, so that an `EventBus` whose bounded log has been
  trimmed can still hand a late subscriber what it needs to rebuild it (see `EventBus.replay`).

Conventions. Every payload may carry `func` (the server function whose log line `message` is: the RAM
cache's events set it). A field whose default is `UNSET` is one a source may not report (the log
reader does not see what the engine knows, e.g. `SlotDecision.lost`): UNSET is falsy and is left out
of the JSON; a field that is None is written as null. Fields starting with `_` are private to the
process (never serialized). Token counts are `n_*`, byte sizes `size*`, positions `pos_*`, fractions
`f_*`; `entry_id` names a RAM-cache entry for its whole life (from `cache_alloc` to its `cache_evict`).
The JSON keys come in field order, so the order of a class's fields is the order of its JSON.

Adding a kind: a constant, then a `@dataclass(frozen=True, kw_only=True)` subclass of its family's
base with `KINDS = (CONSTANT,)` and its fields (a field with a default is optional). Nothing else: the
registry and `FAMILIES` are built from the classes when the module loads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Hashable, Optional

import numpy as np

# ---------------------------------------------------------------------------------------------- kinds

# init / params
CACHE_INIT = "cache_init"
PARAMS = "params"
INIT = "init"
# task lifecycle
TASK_QUEUED = "task_queued"
TASK_DEFERRED = "task_deferred"
TASK_UNDEFERRED = "task_undeferred"
TASK_CANCELLED = "task_cancelled"
TASK_LAUNCHED = "task_launched"
TASK_ERROR = "task_error"
TASK_DONE = "task_done"
SLOT_RELEASE = "slot_release"
CALLBACK_ERROR = "callback_error"
SLOT_EXCEPTION = "slot_exception"
# slot selection (and what happens to idle slots)
SLOT_SELECTED_BY_ID = "slot_selected_by_id"
SLOT_SKIP = "slot_skip"
SLOT_SIM = "slot_sim"
SLOT_SELECTED_BY_LCP = "slot_selected_by_lcp"
SLOT_SELECTED_BY_LRU = "slot_selected_by_lru"
SLOT_DECISION = "slot_decision"
IDLE_SLOT_SAVE = "idle_slot_save"
IDLE_SLOT_SAVED = "idle_slot_saved"
SLOT_CLEAR = "slot_clear"
SLOT_PURGE = "slot_purge"
# RAM prompt cache
CACHE_UPDATE_BEGIN = "cache_update_begin"
CACHE_UPDATE_END = "cache_update_end"
CACHE_SAVE = "cache_save"
CACHE_SKIP_DUPLICATE = "cache_skip_duplicate"
CACHE_SKIP_OVER_LIMIT = "cache_skip_over_limit"
CACHE_SKIP_ENTRY_LIMIT = "cache_skip_entry_limit"  # proposal kvcpc (PR #28046)
CACHE_LRU_PLACED = "cache_lru_placed"  # proposal cache-ram-lru
CACHE_DISK_WRITE = "cache_disk_write"  # proposal cache-disk (PR #28092)
CACHE_DISK_EVICT = "cache_disk_evict"
CACHE_DISK_LOAD = "cache_disk_load"
CACHE_EVICT = "cache_evict"
CACHE_ALLOC_FAILED = "cache_alloc_failed"
CACHE_LIMIT_REDUCED = "cache_limit_reduced"
CACHE_ALLOC = "cache_alloc"
CACHE_LOAD_BASE = "cache_load_base"
CACHE_LOAD_SCORE = "cache_load_score"
CACHE_LOAD_FOUND = "cache_load_found"
CACHE_LOAD_SCORES = "cache_load_scores"
CACHE_RESTORE_FAILED = "cache_restore_failed"
CACHE_LOAD_FAILED = "cache_load_failed"
CACHE_LOADED = "cache_loaded"
CACHE_STATE = "cache_state"
CACHE_STATE_ENTRY = "cache_state_entry"
# prompt processing
PROMPT_START = "prompt_start"
PROMPT_EMPTY = "prompt_empty"
PROMPT_FULL_MATCH = "prompt_full_match"
PROMPT_PLAN = "prompt_plan"
PROMPT_SEQ_RM = "prompt_seq_rm"
PROMPT_BATCH = "prompt_batch"
# context checkpoints
CHECKPOINT_CREATED = "checkpoint_created"
CHECKPOINT_EVICT = "checkpoint_evict"
CHECKPOINT_CHECK = "checkpoint_check"
CHECKPOINT_NONE = "checkpoint_none"
CHECKPOINT_RESTORED = "checkpoint_restored"
# cache reuse (--cache-reuse)
CACHE_REUSE_UNSUPPORTED = "cache_reuse_unsupported"
CACHE_REUSE_BEGIN = "cache_reuse_begin"
CACHE_REUSE_SHIFT = "cache_reuse_shift"
CACHE_REUSE_END = "cache_reuse_end"
# slot files (--slot-save-path)
SLOT_SAVED = "slot_saved"
SLOT_RESTORED = "slot_restored"
SLOT_ACTION_UNLOGGED = "slot_action_unlogged"
SLOT_APPENDIX_SKIPPED = "slot_appendix_skipped"
SLOT_DRAFT_DROPPED = "slot_draft_dropped"
# decode / retry
DECODE = "decode"
DECODE_RETRY = "decode_retry"
DECODE_FAILED = "decode_failed"
PHASE_FAILED = "phase_failed"
# speculative decoding (-md)
SPEC_DRAFT = "spec_draft"
SPEC_VERIFY = "spec_verify"
# snapshots (what a view redraws from)
SLOT_SNAPSHOT = "slot_snapshot"
# a source's line that maps to no decision (a real server's log line the watcher does not know)
LOG = "log"
# explanations derived from the facts above (slotlab.explain.attach)
REQUEST_MISS = "request_miss"
# the client's side (slotlab.conversation): which chat call a task is, and what it changed
CLIENT_CALL = "client_call"

#: the `slot_clear` reasons that count as an eviction on the panel (the slot's KV is gone for good)
EVICTING_CLEARS = ("idle_clear", "purge")
#: the checkpoint kinds the panel marks on the checkpoint chain
CHECKPOINT_MARKS = (CHECKPOINT_CREATED, CHECKPOINT_RESTORED, CHECKPOINT_EVICT, CHECKPOINT_NONE)


class _Unset:
    """The value of a field the event's source did not report (falsy; not written to JSON)."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self):
        return "UNSET"


#: a field the source did not report (see the module's conventions)
UNSET = _Unset()


# ---------------------------------------------------------------------------------------------- base

REGISTRY: dict[str, type["Payload"]] = {}


@dataclass(frozen=True, kw_only=True)
class Payload:
    """Base of every payload. `KINDS`: the kinds this class describes (one); `KIND`: that kind;
    `FAMILY`: its family."""

    KINDS: ClassVar[tuple[str, ...]] = ()
    KIND: ClassVar[str] = ""
    FAMILY: ClassVar[str] = ""
    _JSON: ClassVar[tuple[str, ...]] = ()  # the public field names, in order (set when the class is made)

    func: Optional[str] = UNSET
    """The server function whose log line the event's `message` is (`alloc`, `load`, `update`,
    `prompt_save`): set by the RAM cache's events; `Event.log_line()` prints it."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for k in cls.__dict__.get("KINDS", ()):
            if k in REGISTRY and REGISTRY[k] is not cls:
                raise TypeError(f"event kind {k!r} is described twice: {REGISTRY[k].__name__} and {cls.__name__}")
            REGISTRY[k] = cls
            cls.KIND = k

    def as_dict(self) -> dict:
        """The reported fields (not UNSET, not private) as a dict, values as they are."""
        out = {}
        for k in self._JSON:
            v = getattr(self, k)
            if v is not UNSET:
                out[k] = v
        return out

    def to_json(self) -> dict:
        """`as_dict()` as plain JSON values (tuples as lists, numpy numbers as Python ones, nested
        payload parts such as `Held` as dicts)."""
        out = {}
        for k in self._JSON:
            v = getattr(self, k)
            if v is not UNSET:
                out[k] = plain(v)
        return out


@dataclass(frozen=True, kw_only=True)
class Part:
    """A typed part of a payload (e.g. `SlotDecision.held`): serialized as a dict, in field order."""

    _JSON: ClassVar[tuple[str, ...]] = ()

    as_dict = Payload.as_dict
    to_json = Payload.to_json


def plain(v: Any) -> Any:
    """`v` as a JSON value: numpy scalars as Python numbers, tuples as lists, dicts with str keys, a
    `Payload` / `Part` as its dict, a token array of up to 64 as a list (longer: `<N tokens>`)."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (Payload, Part)):
        return v.to_json()
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 64 else f"<{v.size} tokens>"
    return repr(v)


def _json_fields(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if not f.name.startswith("_"))


# ---------------------------------------------------------------------------------------------- parts

@dataclass(frozen=True, kw_only=True)
class Held(Part):
    """What the server held that shares a prefix with a new prompt (`SlotDecision.held`)."""
    where: str
    """`slot` or `entry`."""
    id: int
    """The slot's id or the RAM-cache entry's id."""
    lcp: int
    """Common prefix with the prompt, in tokens."""
    n_held: int
    """Tokens it held."""
    prompt_text: str
    """A few tokens of the prompt on each side of the divergence ("" from a log reader)."""
    held_text: str
    """The same span of what was held."""


@dataclass(frozen=True, kw_only=True)
class Lost(Part):
    """Content dropped lately that shares a prefix with a new prompt (`SlotDecision.lost`)."""
    where: str
    """`slot` or `entry`."""
    id: int
    """The slot's id or the entry's id."""
    reason: str
    """The `slot_clear` / `cache_evict` reason, or `overwritten` (another prompt took the slot)."""
    seq: int
    """Seq of the event that dropped it."""
    lcp: int
    """Common prefix with the prompt, in tokens."""
    n_held: int
    """Tokens it held."""
    prompt_text: str
    """A few tokens of the prompt on each side of the divergence."""
    held_text: str
    """The same span of what was dropped."""
    by_task: Optional[int] = UNSET
    """The task whose prompt overwrote it (`overwritten` only)."""


def _family(name: str):
    def deco(cls):
        cls.FAMILY = name
        return dataclass(frozen=True, kw_only=True)(cls)
    return deco


# ---------------------------------------------------------------------------------------------- init / params

@_family("init")
class InitEvent(Payload):
    """How the engine was started (emitted once, before anything else)."""


@dataclass(frozen=True, kw_only=True)
class CacheInit(InitEvent):
    """The RAM prompt cache at start: enabled (limits given) or disabled (`--cache-ram 0`, no fields)."""
    KINDS = (CACHE_INIT,)
    limit_size: Optional[int] = UNSET
    """Byte limit (0 = none, i.e. `--cache-ram -1`); absent when the cache is disabled."""
    limit_tokens: Optional[int] = UNSET
    """Token limit (the context's n_ctx); absent when the cache is disabled."""


@dataclass(frozen=True, kw_only=True)
class Params(InitEvent):
    """A parameter the engine overrides at start (the server's warning text in `message`); no fields."""
    KINDS = (PARAMS,)


@dataclass(frozen=True, kw_only=True)
class Init(InitEvent):
    """`initializing, n_slots = ...`: the server's shape. The panel's rows come from here."""
    KINDS = (INIT,)
    n_slots: int
    """Number of slots (`-np`)."""
    n_ctx_slot: int
    """Context size of one slot, in tokens."""
    kv_unified: bool
    """`-kvu`: one KV buffer shared by all slots (idle slots may then be cleared / purged)."""
    n_swa: int
    """Sliding-window size of the model (0: no SWA)."""
    cache_ram: int
    """`--cache-ram` in MiB (-1: no byte limit, 0: cache disabled)."""
    flags: list
    """The llama-server flags equivalent to this engine's parameters (list of str)."""
    draft: bool
    """A draft model (`-md`) is loaded: speculative decoding is on."""
    sps: float
    """`--slot-prompt-similarity` (0: selection by LCP similarity is off)."""


# ---------------------------------------------------------------------------------------------- task lifecycle

@_family("task")
class TaskEvent(Payload):
    """A request's life: queued, deferred, launched into a slot, done or failed, slot released."""


@dataclass(frozen=True, kw_only=True)
class TaskQueued(TaskEvent):
    """A completion was submitted (event `task` = its id, `slot` = -1)."""
    KINDS = (TASK_QUEUED,)
    n_tokens: int
    """Prompt length in tokens."""
    id_slot: int
    """The slot the request asked for (-1: any)."""


@dataclass(frozen=True, kw_only=True)
class TaskDeferred(TaskEvent):
    """No slot (or not the requested one) is free: the task waits (reason in `message`); no fields."""
    KINDS = (TASK_DEFERRED,)


@dataclass(frozen=True, kw_only=True)
class TaskUndeferred(TaskEvent):
    """A slot was released: one deferred task moves to the front of the queue."""
    KINDS = (TASK_UNDEFERRED,)
    id_slot: int
    """The slot whose release woke the task."""


@dataclass(frozen=True, kw_only=True)
class TaskCancelled(TaskEvent):
    """The client went away while the task ran in `slot`; no fields."""
    KINDS = (TASK_CANCELLED,)


@dataclass(frozen=True, kw_only=True)
class TaskLaunched(TaskEvent):
    """`launch_slot_with_task`: the task occupies `slot`."""
    KINDS = (TASK_LAUNCHED,)
    n_tokens: int
    """Prompt length in tokens."""


@dataclass(frozen=True, kw_only=True)
class TaskFailed(TaskEvent):
    """The task failed (`message` = the error text the client gets)."""
    KINDS = (TASK_ERROR,)
    code: int
    """HTTP status the server answers with."""
    type: str
    """Error type (`server_error`, `exceed_context_size_error`, ...)."""


@dataclass(frozen=True, kw_only=True)
class TaskDone(TaskEvent):
    """The final response was sent (the request's numbers, as in its `timings`)."""
    KINDS = (TASK_DONE,)
    cache_n: int
    """Prompt tokens reused from the slot / RAM cache / file / checkpoint (`timings.cache_n`)."""
    prompt_n: int
    """Prompt tokens processed (`timings.prompt_n`)."""
    predicted_n: int
    """Tokens generated."""
    tokens_cached: int
    """Tokens the slot holds after the request."""


@dataclass(frozen=True, kw_only=True)
class CallbackError(TaskEvent):
    """The request's `on_token` callback (a streaming client) raised; the task goes on (`message`
    has the error too)."""
    KINDS = (CALLBACK_ERROR,)
    error: str
    """`repr()` of the exception."""


@dataclass(frozen=True, kw_only=True)
class SlotException(TaskEvent):
    """`iterate` (SC:2711-2732) caught an exception in one slot's part of a phase:
    `message` = "got exception: ..." (the text the task's error carries too); the slot is released,
    the other slots go on."""
    KINDS = (SLOT_EXCEPTION,)
    error: str
    """`repr()` of the exception."""


@dataclass(frozen=True, kw_only=True)
class SlotRelease(TaskEvent):
    """`release`: the slot stops processing (it keeps its tokens and KV)."""
    KINDS = (SLOT_RELEASE,)
    n_tokens: int
    """Tokens the slot holds."""


# ---------------------------------------------------------------------------------------------- slot selection

@_family("selection")
class SelectionEvent(Payload):
    """`get_available_slot` and what happens to idle slots (saved to the RAM cache, cleared, purged)."""


@dataclass(frozen=True, kw_only=True)
class SlotSelectedById(SelectionEvent):
    """The request named its slot (`id_slot`); no fields."""
    KINDS = (SLOT_SELECTED_BY_ID,)


@dataclass(frozen=True, kw_only=True)
class SlotSkip(SelectionEvent):
    """A slot is not considered for LCP similarity (busy or empty: `message`); no fields."""
    KINDS = (SLOT_SKIP,)


@dataclass(frozen=True, kw_only=True)
class SlotSim(SelectionEvent):
    """One slot's LCP similarity against the new prompt."""
    KINDS = (SLOT_SIM,)
    lcp: int
    """Common prefix of the slot's tokens and the prompt, in tokens."""
    f_sim: float
    """lcp / prompt length (float32 as the server computes it)."""


@dataclass(frozen=True, kw_only=True)
class SlotSelectedByLcp(SelectionEvent):
    """The most similar slot above `--slot-prompt-similarity` was chosen."""
    KINDS = (SLOT_SELECTED_BY_LCP,)
    f_sim: float
    """Best similarity (lcp / prompt length)."""
    f_keep: float
    """Fraction of the slot's tokens the prompt keeps (lcp / slot tokens); < 0.5 triggers a RAM-cache update."""


@dataclass(frozen=True, kw_only=True)
class SlotSelectedByLru(SelectionEvent):
    """The least recently used free slot was chosen."""
    KINDS = (SLOT_SELECTED_BY_LRU,)
    t_last: int
    """The chosen slot's last release time (µs; -1: never used)."""


@dataclass(frozen=True, kw_only=True)
class SlotDecision(SelectionEvent):
    """Summary of the selection (the engine's, not a server log line); `slot` = -1 when none is free."""
    KINDS = (SLOT_DECISION,)
    how: Optional[str]
    """`id`, `lcp`, `lru`, or None (no slot)."""
    f_sim: float
    """Best LCP similarity found (0 when none)."""
    f_keep: Optional[float]
    """f_keep of the LCP choice (None when not chosen by similarity)."""
    update_cache: bool
    """The RAM cache was to be updated (save the slot, look for a better entry)."""
    load: Optional[bool]
    """True: a RAM entry was restored; False: the restore failed; None: nothing loaded."""
    id_requested: int
    """The slot the request asked for (`id_slot`; -1: any)."""
    held: Optional[Held] = UNSET
    """At arrival, the longest common prefix with anything held (a `Held`); None when nothing shares a
    token. Facts for `slotlab.explain`; they decide nothing."""
    lost: Optional[Lost] = UNSET
    """The same against content dropped lately (a cleared slot, an evicted entry): a `Lost`, which adds
    the drop's `reason` and the `seq` of the event that dropped it; None when nothing dropped shares a
    token; UNSET from a source that does not track drops (a log reader)."""
    checks: Optional[list] = UNSET
    """Step B's scan as (id_slot, skipped, lcp, f_sim): `skipped` is `is_processing`, `empty` or None."""
    sps: Optional[float] = UNSET
    """`-sps` as the log's similarity lines print it (`> 0.900 thold`): a log reader's only source of it,
    since the server does not print the flag at start. The engine leaves it UNSET (its `init` has it)."""
    f_keep_best: Optional[float] = UNSET
    """Winning entry's f_keep (only when `load` is True)."""
    f_sim_best: Optional[float] = UNSET
    """Winning entry's f_sim (only when `load` is True)."""
    f_keep_base: Optional[float] = UNSET
    """The slot's own f_keep it had to beat (only when `load` is True)."""
    proposal: Optional[str] = UNSET
    """The proposal (slotlab/proposals) that changed this decision, e.g. `find-better` set update_cache."""


@dataclass(frozen=True, kw_only=True)
class IdleSlotSave(SelectionEvent):
    """`--cache-idle-slots`: an idle slot is about to be saved to the RAM cache; no fields."""
    KINDS = (IDLE_SLOT_SAVE,)


@dataclass(frozen=True, kw_only=True)
class IdleSlotSaved(SelectionEvent):
    """The idle slot was saved (the server's test tag in `message`); no fields."""
    KINDS = (IDLE_SLOT_SAVED,)


@dataclass(frozen=True, kw_only=True)
class SlotClear(SelectionEvent):
    """`prompt_clear`: the slot's tokens and KV are dropped."""
    KINDS = (SLOT_CLEAR,)
    reason: str
    """`idle_clear`, `purge`, `load_failed`, `decode_failed`, `restore_failed`, `erase`, `clear`."""
    n_tokens: int
    """Tokens the slot held before the clear."""


@dataclass(frozen=True, kw_only=True)
class SlotPurge(SelectionEvent):
    """No KV space: an idle slot is purged to make room (event `slot` = -1; the slot is `id_slot`)."""
    KINDS = (SLOT_PURGE,)
    id_slot: int
    """The purged slot."""
    n_tokens: int
    """Tokens it held."""


# ---------------------------------------------------------------------------------------------- RAM prompt cache

@_family("ram_cache")
class RamCacheEvent(Payload):
    """`server_prompt_cache`: save / alloc / evict / load / update, with the server's log lines."""


@dataclass(frozen=True, kw_only=True)
class CacheUpdateBegin(RamCacheEvent):
    """`updating prompt cache`: the chosen slot is saved and a better entry looked for; no fields."""
    KINDS = (CACHE_UPDATE_BEGIN,)


@dataclass(frozen=True, kw_only=True)
class CacheUpdateEnd(RamCacheEvent):
    """The update finished (duration in `message`); no fields."""
    KINDS = (CACHE_UPDATE_END,)


@dataclass(frozen=True, kw_only=True)
class CacheSave(RamCacheEvent):
    """`prompt_save`: a slot's prompt is offered to the cache."""
    KINDS = (CACHE_SAVE,)
    n_tokens: int
    """Prompt length."""
    size_tgt: int
    """Target-context state size in bytes."""
    size_dft: int
    """Draft-context state size in bytes (0 without -md)."""
    id_slot: int
    """Slot the prompt comes from."""
    id_task: int
    """Task that last used the slot (-1: none)."""


@dataclass(frozen=True, kw_only=True)
class CacheSkipDuplicate(RamCacheEvent):
    """The prompt is a prefix of (or equal to) an entry: not cached again."""
    KINDS = (CACHE_SKIP_DUPLICATE,)
    entry_id: int
    """The entry that already holds it."""
    n_tokens: int
    """Prompt length."""


@dataclass(frozen=True, kw_only=True)
class CacheSkipOverLimit(RamCacheEvent):
    """The prompt alone exceeds the byte limit: not cached."""
    KINDS = (CACHE_SKIP_OVER_LIMIT,)
    size: int
    """Its state size (target + draft + checkpoints), bytes."""
    limit_size: int
    """The byte limit."""
    n_tokens: int
    """Prompt length."""


@dataclass(frozen=True, kw_only=True)
class CacheSkipEntryLimit(RamCacheEvent):
    """Proposal kvcpc (PR #28046, `-kvcpc N`): the prompt has more tokens than one entry may hold."""
    KINDS = (CACHE_SKIP_ENTRY_LIMIT,)
    n_tokens: int
    """Prompt length."""
    limit_tokens_entry: int
    """The per-entry token limit (-kvcpc N, or one slot's context for 0)."""


@dataclass(frozen=True, kw_only=True)
class CacheLruPlaced(RamCacheEvent):
    """Proposal cache-ram-lru: an entry placed by last use anywhere but at the back of the list."""
    KINDS = (CACHE_LRU_PLACED,)
    entry_id: int
    """The entry (new, or refreshed by a save of a prompt it holds)."""
    t_last: int
    """When its prompt was last used (the slot's t_last_used)."""
    position: int
    """Its place in the list, 0 = the front (evicted first)."""
    n_entries: int
    """Entries in the list."""


@dataclass(frozen=True, kw_only=True)
class CacheDiskWrite(RamCacheEvent):
    """Proposal cache-disk (PR #28092): an entry the RAM limits evicted is written to the disk tier."""
    KINDS = (CACHE_DISK_WRITE,)
    entry_id: int
    """The entry."""
    n_tokens: int
    """Its prompt length."""
    size: int
    """Its bytes on disk."""


@dataclass(frozen=True, kw_only=True)
class CacheDiskEvict(CacheDiskWrite):
    """Proposal cache-disk: the disk tier's oldest entry dropped to make room for another."""
    KINDS = (CACHE_DISK_EVICT,)


@dataclass(frozen=True, kw_only=True)
class CacheDiskLoad(CacheDiskWrite):
    """Proposal cache-disk: the load's winner read back from the disk tier into a slot."""
    KINDS = (CACHE_DISK_LOAD,)


@dataclass(frozen=True, kw_only=True)
class CacheEvict(RamCacheEvent):
    """An entry leaves the cache (ends the life `cache_alloc` began)."""
    KINDS = (CACHE_EVICT,)
    reason: str
    """`make_room`, `byte_limit`, `token_limit`, `obsolete_prefix`, `loaded` (restored into a slot),
    `shrink` (after a failed allocation), `cleared` (the lab's clear button, func `clear`)."""
    entry_id: int
    """The entry."""
    n_tokens: int
    """Its tokens."""
    size: int
    """Its bytes (target + draft + checkpoints)."""


@dataclass(frozen=True, kw_only=True)
class CacheAllocFailed(RamCacheEvent):
    """`std::bad_alloc` while allocating an entry (`cache_limit_reduced` follows)."""
    KINDS = (CACHE_ALLOC_FAILED,)
    size_tgt: int
    """Requested target-state bytes."""
    size_dft: int
    """Requested draft-state bytes."""
    error: str
    """The allocator's error text."""


@dataclass(frozen=True, kw_only=True)
class CacheLimitReduced(RamCacheEvent):
    """After a failed allocation the byte limit drops to 40 % of what is cached, for good."""
    KINDS = (CACHE_LIMIT_REDUCED,)
    limit_size: int
    """The new byte limit."""
    limit_size_old: int
    """The previous one."""


@dataclass(frozen=True, kw_only=True)
class CacheAlloc(RamCacheEvent):
    """A new entry was appended (newest last; FIFO order = allocation order)."""
    KINDS = (CACHE_ALLOC,)
    entry_id: int
    """The entry's id, for its whole life."""
    n_tokens: int
    """Its tokens."""
    size: int
    """Its bytes (target + draft + checkpoints)."""
    id_slot: int
    """Slot it was saved from."""
    id_task: int
    """Task that last used that slot (-1: none)."""
    size_main: int
    """Target-context state bytes."""
    size_dft: int
    """Draft-context state bytes."""
    size_ckpt: int
    """Bytes of its context checkpoints."""
    n_checkpoints: int
    """Number of its context checkpoints."""
    head: str
    """The prompt's first tokens as text (for tables)."""
    checkpoints: list
    """Its checkpoints as (pos_min, pos_max, n_tokens, size) tuples."""


@dataclass(frozen=True, kw_only=True)
class CacheLoadBase(RamCacheEvent):
    """`load`: the slot's own baseline the entries must beat."""
    KINDS = (CACHE_LOAD_BASE,)
    lcp: int
    """Common prefix of the slot's tokens and the new prompt."""
    f_keep: float
    """lcp / slot tokens (-1 for an empty slot)."""
    f_sim: float
    """lcp / prompt tokens."""
    n_tokens: int
    """The slot's tokens."""


@dataclass(frozen=True, kw_only=True)
class CacheLoadScore(RamCacheEvent):
    """One entry's scores against the new prompt (scan order: oldest first)."""
    KINDS = (CACHE_LOAD_SCORE,)
    entry_id: int
    """The entry."""
    n_tokens: int
    """Its tokens."""
    lcp: int
    """Common prefix with the new prompt."""
    f_keep: float
    """lcp / entry tokens (below 0.25 the entry is skipped)."""
    f_sim: float
    """lcp / prompt tokens."""


@dataclass(frozen=True, kw_only=True)
class CacheLoadFound(RamCacheEvent):
    """An entry beat the slot on both f_keep and f_sim: it will be restored."""
    KINDS = (CACHE_LOAD_FOUND,)
    entry_id: int
    """The winner."""
    f_keep: float
    """Its f_keep."""
    f_sim: float
    """Its f_sim."""


@dataclass(frozen=True, kw_only=True)
class CacheLoadScores(RamCacheEvent):
    """All scores of one look-up as a table (the engine's, for views): after a real `load` or, with
    `preview` True, computed silently for a slot that needed no load."""
    KINDS = (CACHE_LOAD_SCORES,)
    preview: bool
    """True: scores only (nothing was loaded nor logged by the server)."""
    lcp_base: int
    """The slot's common prefix with the prompt."""
    f_keep_base: float
    """The slot's f_keep (-1: empty slot)."""
    f_sim_base: float
    """The slot's f_sim."""
    winner_id: Optional[int]
    """The entry that won (None: none)."""
    scores: list
    """One dict per entry, scan order: entry_id, n_tokens, lcp, f_keep, f_sim, below_floor, improved, winner."""


@dataclass(frozen=True, kw_only=True)
class CacheRestoreFailed(RamCacheEvent):
    """Restoring an entry's state into the slot failed (`cache_load_failed` follows)."""
    KINDS = (CACHE_RESTORE_FAILED,)
    entry_id: int
    """The entry."""
    which: str
    """`tgt` (target context: the entry stays cached) or `dft` (draft context)."""
    size: int
    """Bytes that were to be restored."""


@dataclass(frozen=True, kw_only=True)
class CacheLoadFailed(RamCacheEvent):
    """`failed to load prompt from cache`: the slot is cleared; no fields."""
    KINDS = (CACHE_LOAD_FAILED,)


@dataclass(frozen=True, kw_only=True)
class CacheLoaded(RamCacheEvent):
    """An entry was restored into `slot` (and taken out of the cache: `cache_evict` reason `loaded`)."""
    KINDS = (CACHE_LOADED,)
    entry_id: int
    """The entry."""
    n_tokens: int
    """Tokens the slot holds now."""
    f_keep: float
    """The entry's f_keep."""
    f_sim: float
    """The entry's f_sim."""


@dataclass(frozen=True, kw_only=True)
class CacheState(RamCacheEvent):
    """`update`: the cache's totals and limits after enforcing them (the panel's gauges)."""
    KINDS = (CACHE_STATE,)
    n_entries: int
    """Entries cached."""
    size: int
    """Bytes cached."""
    n_tokens: int
    """Tokens cached."""
    limit_size: int
    """Byte limit (0: none)."""
    limit_tokens: int
    """Token limit given at start (n_ctx)."""
    limit_tokens_cur: int
    """Token cap enforced now: max(limit_tokens, limit_size / bytes per token)."""


@dataclass(frozen=True, kw_only=True)
class CacheStateEntry(RamCacheEvent):
    """One line per entry after `cache_state`."""
    KINDS = (CACHE_STATE_ENTRY,)
    entry_id: int
    """The entry."""
    n_tokens: int
    """Its tokens."""
    n_checkpoints: int
    """Its context checkpoints."""
    size: int
    """Its bytes."""


# ---------------------------------------------------------------------------------------------- prompt processing

@_family("prompt")
class PromptEvent(Payload):
    """`update_slots`' prompt half: reuse, n_past, batches of prompt tokens."""


@dataclass(frozen=True, kw_only=True)
class PromptStart(PromptEvent):
    """`new prompt, n_ctx_slot = ...`; no fields."""
    KINDS = (PROMPT_START,)


@dataclass(frozen=True, kw_only=True)
class PromptEmpty(PromptEvent):
    """Empty prompt: the slot is released at once; no fields."""
    KINDS = (PROMPT_EMPTY,)


@dataclass(frozen=True, kw_only=True)
class PromptFullMatch(PromptEvent):
    """The whole prompt is cached: n_past is lowered by one (two events, texts in `message`); no fields."""
    KINDS = (PROMPT_FULL_MATCH,)


@dataclass(frozen=True, kw_only=True)
class PromptPlan(PromptEvent):
    """The facts of the request's start (spec 3.2-3.6): how much is reused and from where. The
    explanations (provenance spans, the "why" line: `slotlab.explain`) are folded from this and the
    task's `slot_decision`."""
    KINDS = (PROMPT_PLAN,)
    n_past: int
    """Tokens reused (not processed again), after cache reuse, checkpoint rewind and the full-match rule."""
    n_prompt: int
    """Prompt length."""
    lcp: int
    """Common prefix of what the slot held and the prompt."""
    ckpt: Optional[str]
    """`restored` (a checkpoint was restored), `forced` (none usable: full re-processing), or None."""
    origin: str
    """Where the slot's tokens came from: `slot`, `cache #<id>`, `file <name>`."""
    shifts: list
    """Cache-reuse shifts as (src_start, src_end, dst_start, dst_end)."""
    divergence: int
    """First position where the prompt differs from what the slot held (-1: none)."""
    div_text: str
    """The prompt's token at that position, as text ("" when none)."""
    checkpoints: Optional[list] = UNSET
    """The slot's checkpoints before the rewind decision, as (pos_min, pos_max, n_tokens)."""
    pos_min: Optional[int] = UNSET
    """The slot memory's pos_min when the rewind was decided (None when not needed)."""
    pos_min_thold: Optional[int] = UNSET
    """`max(0, pos_next - n_swa ...)`: pos_min at or above it means a cut-back needs a checkpoint."""
    cache_prompt: Optional[bool] = UNSET
    """The request's `cache_prompt`."""
    n_cache_reuse: Optional[int] = UNSET
    """The request's effective `--cache-reuse` chunk size (0: off)."""


@dataclass(frozen=True, kw_only=True)
class PromptSeqRm(PromptEvent):
    """`memory_seq_rm [p0, end)` before adding prompt tokens; no fields (numbers in `message`)."""
    KINDS = (PROMPT_SEQ_RM,)


@dataclass(frozen=True, kw_only=True)
class PromptBatch(PromptEvent):
    """Prompt tokens of `slot` added to this step's batch."""
    KINDS = (PROMPT_BATCH,)
    n_added: int
    """Tokens added by this slot to the batch."""
    n_tokens: int
    """Tokens the slot holds now (reused + added so far)."""
    n_prompt: int
    """Prompt length."""


# ---------------------------------------------------------------------------------------------- checkpoints

@_family("checkpoint")
class CheckpointEvent(Payload):
    """Context checkpoints (SWA / recurrent memory): created, evicted, checked, restored, none usable."""


@dataclass(frozen=True, kw_only=True)
class CheckpointCreated(CheckpointEvent):
    """A checkpoint of the slot's memory was taken."""
    KINDS = (CHECKPOINT_CREATED,)
    n_tokens: int
    """Tokens the slot held at the checkpoint."""
    pos_min: int
    """Lowest position the memory holds."""
    pos_max: int
    """Highest position it holds."""
    size: int
    """Its bytes."""


@dataclass(frozen=True, kw_only=True)
class CheckpointEvict(CheckpointEvent):
    """A checkpoint is dropped."""
    KINDS = (CHECKPOINT_EVICT,)
    reason: str
    """`too_close`, `fifo`, `supersede`, `invalidated` (beyond the new n_past)."""
    n_tokens: int
    """Its n_tokens."""
    pos_min: int
    """Its pos_min."""
    pos_max: int
    """Its pos_max."""


@dataclass(frozen=True, kw_only=True)
class CheckpointCheck(CheckpointEvent):
    """A checkpoint is tested for restore (range in `message`); no fields."""
    KINDS = (CHECKPOINT_CHECK,)


@dataclass(frozen=True, kw_only=True)
class CheckpointNone(CheckpointEvent):
    """No usable checkpoint: full prompt re-processing forced; no fields."""
    KINDS = (CHECKPOINT_NONE,)


@dataclass(frozen=True, kw_only=True)
class CheckpointRestored(CheckpointEvent):
    """A checkpoint was restored into the slot's memory."""
    KINDS = (CHECKPOINT_RESTORED,)
    n_tokens: int
    """The checkpoint's n_tokens."""
    n_past: int
    """Tokens reused after the restore."""
    pos_min: int
    """The checkpoint's pos_min."""
    pos_max: int
    """The checkpoint's pos_max."""
    size: int
    """Its bytes (target + draft)."""


# ---------------------------------------------------------------------------------------------- cache reuse

@_family("cache_reuse")
class CacheReuseEvent(Payload):
    """`--cache-reuse N`: chunks of the slot's KV shifted to where the new prompt has them."""


@dataclass(frozen=True, kw_only=True)
class CacheReuseUnsupported(CacheReuseEvent):
    """The memory cannot shift: n_cache_reuse ignored; no fields."""
    KINDS = (CACHE_REUSE_UNSUPPORTED,)


@dataclass(frozen=True, kw_only=True)
class CacheReuseBegin(CacheReuseEvent):
    """The chunk search starts after the common prefix; no fields."""
    KINDS = (CACHE_REUSE_BEGIN,)


@dataclass(frozen=True, kw_only=True)
class CacheReuseShift(CacheReuseEvent):
    """A chunk was shifted."""
    KINDS = (CACHE_REUSE_SHIFT,)
    src: list
    """[start, end) in the slot's cache before the shift."""
    dst: list
    """[start, end) in the new prompt."""


@dataclass(frozen=True, kw_only=True)
class CacheReuseEnd(CacheReuseEvent):
    """The search ended (new n_past in `message`); no fields."""
    KINDS = (CACHE_REUSE_END,)


# ---------------------------------------------------------------------------------------------- slot files

@_family("slot_file")
class SlotFileEvent(Payload):
    """`POST /slots?action=save|restore` with `--slot-save-path`."""


@dataclass(frozen=True, kw_only=True)
class SlotSaved(SlotFileEvent):
    """The slot was written to a file."""
    KINDS = (SLOT_SAVED,)
    filename: str
    """File name in the slot directory."""
    n_tokens: int
    """Tokens saved."""
    n_bytes: int
    """Bytes written (state + tokens)."""
    n_bytes_appendix: int
    """Bytes of slotlab's appendices (checkpoints, draft state; 0 without them)."""
    n_checkpoints: int
    """Checkpoints written in the appendix."""


@dataclass(frozen=True, kw_only=True)
class SlotRestored(SlotFileEvent):
    """The slot was read from a file."""
    KINDS = (SLOT_RESTORED,)
    filename: str
    """File name in the slot directory."""
    n_tokens: int
    """Tokens restored."""
    n_bytes: int
    """Bytes read (state + tokens)."""
    n_bytes_appendix: int
    """Bytes of appendices read."""
    n_checkpoints: int
    """Checkpoints the slot holds after the restore."""


@dataclass(frozen=True, kw_only=True)
class SlotActionUnlogged(SlotFileEvent):
    """A log reader's: the server ran a task that printed nothing but `all slots are idle` (a loop
    iteration of its own). That is a successful save, a restore that no later line reveals (an empty
    file, or a slot nobody uses again), or a `GET /slots` / `/metrics` read: the server logs none of
    them. The kind, slot, file and sizes are not in the log; a recorded HTTP side fills them
    (`slotlab.watch.http_side.fill`). Event `slot` -1, `task` -1."""
    KINDS = (SLOT_ACTION_UNLOGGED,)
    may_be: tuple
    """What it can be: ("save", "restore", "read"), "read" being a `/slots` or `/metrics` poll."""


@dataclass(frozen=True, kw_only=True)
class SlotAppendixSkipped(SlotFileEvent):
    """An appendix of the file could not be used (why in `message`); no fields."""
    KINDS = (SLOT_APPENDIX_SKIPPED,)


@dataclass(frozen=True, kw_only=True)
class SlotDraftDropped(SlotFileEvent):
    """The file's draft data does not fit the draft context: dropped (`message`); no fields."""
    KINDS = (SLOT_DRAFT_DROPPED,)


# ---------------------------------------------------------------------------------------------- decode / retry

@_family("decode")
class DecodeEvent(Payload):
    """`llama_decode` of one chunk of the step's batch: success, retry with a smaller batch, failure."""


@dataclass(frozen=True, kw_only=True)
class Decode(DecodeEvent):
    """A chunk was decoded."""
    KINDS = (DECODE,)
    off: int
    """Offset of the chunk in the batch."""
    n_tokens: int
    """Tokens in the chunk."""
    n_prompt: int
    """Of which prompt tokens."""
    ms: float
    """Wall time of the decode, milliseconds."""
    _steps: Optional[int] = None
    """Decode steps this one event stands for (the simulator's fast-forward folds several; None: one).
    Private: not serialized."""


@dataclass(frozen=True, kw_only=True)
class DecodeRetry(DecodeEvent):
    """No KV space: an idle slot was purged or the batch halved; the chunk is retried."""
    KINDS = (DECODE_RETRY,)
    ret: int
    """`llama_decode`'s return code."""
    off: int
    """Offset of the chunk."""
    n_batch: int
    """Batch size for the retry."""


@dataclass(frozen=True, kw_only=True)
class DecodeFailed(DecodeEvent):
    """A fatal decode error: every processing slot gets it and is released."""
    KINDS = (DECODE_FAILED,)
    ret: int
    """`llama_decode`'s return code (of the draft context when the speculative batch failed)."""
    off: int
    """Offset of the chunk."""
    n_batch: int
    """Batch size."""


@dataclass(frozen=True, kw_only=True)
class PhaseFailed(DecodeEvent):
    """`update_slots` caught an exception of a whole phase (SC:2815-2886): `message` =
    "pre_decode() failed: ..." (or decode / post_decode); every processing slot got it as its error
    (`abort_all_slots`) and the loop goes on with the next iteration."""
    KINDS = (PHASE_FAILED,)
    phase: str
    """`pre_decode`, `decode` or `post_decode`."""
    error: str
    """`repr()` of the exception."""


# ---------------------------------------------------------------------------------------------- speculative

@_family("speculative")
class SpecEvent(Payload):
    """Speculative decoding with a draft model (`-md`)."""


@dataclass(frozen=True, kw_only=True)
class SpecDraft(SpecEvent):
    """The draft model proposed tokens for `slot`."""
    KINDS = (SPEC_DRAFT,)
    n_draft: int
    """Tokens drafted."""


@dataclass(frozen=True, kw_only=True)
class SpecVerify(SpecEvent):
    """The target verified the draft."""
    KINDS = (SPEC_VERIFY,)
    n_draft: int
    """Tokens drafted."""
    n_accepted: int
    """Of which accepted."""


# ---------------------------------------------------------------------------------------------- snapshots

@_family("snapshot")
class SnapshotEvent(Payload):
    """What a view needs to redraw a slot without reading engine state."""


@dataclass(frozen=True, kw_only=True)
class SlotSnapshot(SnapshotEvent):
    """The picture of `slot` after a step in which it changed (event `task` = its current or last task)."""
    KINDS = (SLOT_SNAPSHOT,)
    state: str
    """Slot state (`idle`, `started`, `processing_prompt`, `done_prompt`, `generating`)."""
    n_tokens: int
    """Tokens the slot holds."""
    n_prompt: int
    """Prompt length of its current or last request (0 when it never had one)."""
    n_past: int
    """Prompt tokens reused (cache_n)."""
    prompt_n: int
    """Prompt tokens processed so far."""
    n_gen: int
    """Tokens generated so far."""
    origin: str
    """Where the slot's tokens came from: `slot`, `cache #<id>`, `file <name>`."""
    shifts: list
    """Cache-reuse shifts of this request as (src_start, src_end, dst_start, dst_end)."""
    checkpoints: list
    """The slot's checkpoints as (pos_min, pos_max, n_tokens, size, id_task)."""


# ---------------------------------------------------------------------------------------------- plain log lines

@_family("log")
class LogEvent(Payload):
    """Text a source reported that is no decision slotlab models (kept, never an error)."""


@dataclass(frozen=True, kw_only=True)
class Log(LogEvent):
    """One log line of a watched llama-server that the reader does not map to a decision; the line
    is in `message`, its level in the event's level."""
    KINDS = (LOG,)


# ---------------------------------------------------------------------------------------------- explanations

@_family("explain")
class ExplainEvent(Payload):
    """Derived, not decided: what `slotlab.explain` concludes from the facts above, emitted right after
    the fact that completes it (so a log, a panel or `--events` carries it like any other event)."""


@dataclass(frozen=True, kw_only=True)
class RequestMiss(ExplainEvent):
    """The request reused fewer tokens than the server held for it; `message` is the plain line."""
    KINDS = (REQUEST_MISS,)
    cause: str
    """`dropped`, `busy`, `pinned`, `threshold`, `slot_kept`, `floor`, `two_axis`, `restore_failed`,
    `no_checkpoint`, `checkpoint_early`, `cache_prompt_off`, `other` (slotlab.explain.CAUSES)."""
    lost: int
    """Tokens that could have been reused and were prefilled again."""
    possible: int
    """The longest prefix held (or dropped lately), capped at n_prompt - 1."""
    n_past: int
    """Tokens actually reused."""
    n_prompt: int
    """Prompt length."""
    where: str
    """Where the prefix was: `slot N` or `entry #N`."""
    detail: str
    """The mechanism in words, with its numbers."""
    prompt_text: str = ""
    """A few tokens of the prompt around the divergence."""
    held_text: str = ""
    """The same span of what was held."""
    suggest: list = dataclasses.field(default_factory=list)
    """Candidate changes, most specific first (flags, or advice)."""


# ---------------------------------------------------------------------------------------------- the client's side

@_family("conversation")
class ConversationEvent(Payload):
    """What the client sent, as slotlab.conversation reads it: emitted by whoever knows the chat call
    behind a task (a session replay, `slotlab.timeline.Conversations`), right after the task is queued,
    so a fold can place the task in its conversation (the panel's conversation timeline)."""


@dataclass(frozen=True, kw_only=True)
class ClientCall(ConversationEvent):
    """The task (`task`) is chat call `request` of conversation `session`, and what that call changed
    against the conversation's previous call (`change` None: it only appended, or it is the first)."""
    KINDS = (CLIENT_CALL,)
    request: int
    """Index of the call in the trace or session log (0-based; the order calls were made in)."""
    session: str
    """The conversation: a session log's `session_id`, else the first call's `#request`."""
    previous: int = -1
    """The request it was compared with (-1: the conversation's first call)."""
    change: Optional[str] = None
    """`system_changed`, `tools_changed`, `message_edited`, `message_inserted`, `compacted`,
    `reply_not_echoed`, `other` (slotlab.conversation.KINDS), or None."""
    message_index: int = -1
    """Index into this call's `messages` where the change is (0 for the system prompt and the tools;
    slotlab.conversation's `message`: the event's own `message` is its text)."""
    role: str = ""
    """That message's role (`tools` for a tools change)."""
    tokens_lost: int = 0
    """Tokens the server held past the divergence that this call sent again (processed again)."""
    before: str = ""
    """The previous call's text there, short, the differing part in `[...]`."""
    after: str = ""
    """This call's text there, the same way."""
    position: int = -1
    """The token where the prompt diverged from what the server held (-1: unknown)."""
    advice: str = ""
    """The client's fix (slotlab.conversation.ADVICE; never a server flag)."""


# ---------------------------------------------------------------------------------------------- registry

def _all_kinds_in_module() -> dict[str, str]:
    return {v: k for k, v in globals().items() if k.isupper() and isinstance(v, str) and not k.startswith("_")}


KINDS: frozenset[str] = frozenset(REGISTRY)
FAMILIES: dict[str, tuple[str, ...]] = {}
for _k, _cls in REGISTRY.items():
    FAMILIES.setdefault(_cls.FAMILY, ())
    FAMILIES[_cls.FAMILY] += (_k,)
for _cls in (*REGISTRY.values(), Held, Lost):
    _cls._JSON = _json_fields(_cls)
del _k, _cls


# ---------------------------------------------------------------------------------------------- retention

@dataclass(frozen=True)
class Retain:
    """A retention rule: of the events trimmed from a bounded log, keep the last `keep` of `kinds`
    per `key(event)` (and only those for which `when(event)` holds). An event of a kind in `until`
    ends the retention of the key it names (a `cache_evict` ends its entry's `cache_alloc`).
    `max_keys` bounds the number of keys (oldest key dropped first)."""

    name: str
    kinds: tuple[str, ...]
    keep: int = 1
    key: Callable[[Any], Hashable] = lambda e: None
    when: Optional[Callable[[Any], bool]] = None
    until: tuple[str, ...] = ()
    max_keys: int = 10_000


def _entry_id(e) -> Hashable:
    return e.payload.entry_id


def _slot(e) -> Hashable:
    return e.slot


def _task(e) -> Hashable:
    return e.task


#: Ring sizes the panel keeps (PanelState uses these): the bus retains at least as many trimmed
#: events of each, so a state rebuilt from a trimmed bus equals the one folded live from event 0.
HISTORY_PER_SLOT = 20
WHY_KEEP = 200
CHECKPOINT_MARKS_KEEP = 200
EVICTIONS_KEEP = 5000
#: conversation timeline bars the panel keeps (each needs its call's client_call and task_done)
TIMELINE_KEEP = 200
#: slot decisions remembered per task (slotlab.explain.Explainer keeps as many)
DECISIONS_KEEP = 4096

#: What defines the current picture. An `EventBus` applies these rules to the events it trims from its
#: log; `EventBus.replay()` returns what they kept plus the log, in seq order.
RETAIN: tuple[Retain, ...] = (
    Retain("init", (INIT,)),
    Retain("cache_init", (CACHE_INIT,)),
    Retain("params", (PARAMS,), keep=8),
    Retain("slot_snapshot", (SLOT_SNAPSHOT,), key=_slot),
    Retain("cache_state", (CACHE_STATE,)),
    Retain("cache_load_scores", (CACHE_LOAD_SCORES,)),
    Retain("cache_entries", (CACHE_ALLOC,), key=_entry_id, until=(CACHE_EVICT,)),
    Retain("task_done", (TASK_DONE,), keep=HISTORY_PER_SLOT, key=_slot),
    # explanations are folded from init (sps), slot_decision and prompt_plan: the plans of each slot's
    # recent requests, the last WHY_KEEP plans, and the decisions of recent tasks
    Retain("prompt_plan_slot", (PROMPT_PLAN,), keep=HISTORY_PER_SLOT, key=_slot),
    Retain("prompt_plan_why", (PROMPT_PLAN,), keep=WHY_KEEP),
    Retain("slot_decision", (SLOT_DECISION,), key=_task, max_keys=DECISIONS_KEEP),
    Retain("checkpoint_marks", CHECKPOINT_MARKS, keep=CHECKPOINT_MARKS_KEEP),
    # the conversation timeline: the last TIMELINE_KEEP calls and their answers
    Retain("client_calls", (CLIENT_CALL,), keep=TIMELINE_KEEP),
    Retain("timeline_done", (TASK_DONE,), keep=TIMELINE_KEEP),
    Retain("evictions", (CACHE_EVICT, SLOT_CLEAR), keep=EVICTIONS_KEEP,
           when=lambda e: e.kind == CACHE_EVICT or (e.payload.reason in EVICTING_CLEARS
                                                      and e.payload.n_tokens > 0)),
)


def _check_module() -> None:
    missing = [name for kind, name in _all_kinds_in_module().items() if kind not in REGISTRY]
    if missing:  # pragma: no cover - a developer adding a constant without its class
        raise TypeError(f"event kind constant(s) without a payload class: {', '.join(missing)}")


_check_module()


# --------------------------------------------------------------------------------- fast constructors

#: the `__init__` dataclasses generated for each payload class whose one is replaced below (tests
#: compare the two)
DATACLASS_INIT: dict[type, Callable] = {}


def _fast_init(cls) -> None:
    """Replace the `__init__` of frozen dataclass `cls` by one that writes the fields straight into the
    instance's `__dict__`, in field order. A frozen dataclass's own `__init__` sets each field through
    `object.__setattr__` (a global look-up and a call per field); payloads are made once per event,
    millions of times in a simulation, where that was most of their cost. The instance is the same
    (same fields, same values, same `__dict__` order; the signature, defaults and kw-only-ness are
    the dataclass's). Classes with a default factory, `__post_init__`, an init=False field or slots
    keep the dataclass's `__init__`."""
    init = cls.__dict__.get("__init__")
    flds = dataclasses.fields(cls)
    if (init is None or not cls.__dataclass_params__.frozen or hasattr(cls, "__post_init__")
            or cls.__dictoffset__ == 0 or any(not f.init or not f.kw_only or f.default_factory is not dataclasses.MISSING
                                              or f.name in ("self", "d") for f in flds)):
        return
    ns = {"MISSING": dataclasses.MISSING}
    params = []
    for i, f in enumerate(flds):
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
    body = "".join(f"    d[{f.name!r}] = {f.name}\n" for f in flds) or "    pass\n"
    src = f"def __init__(self, *, {', '.join(params)}):\n    d = self.__dict__\n{body}" if params else \
        "def __init__(self):\n    pass\n"
    exec(src, ns)
    fn = ns["__init__"]
    fn.__qualname__ = f"{cls.__qualname__}.__init__"
    fn.__module__ = cls.__module__
    DATACLASS_INIT[cls] = init
    cls.__init__ = fn


for _cls in set(REGISTRY.values()):
    _fast_init(_cls)
del _cls
