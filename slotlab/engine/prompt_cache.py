"""llama-server's RAM prompt cache (`server_prompt_cache`, spec section 2, ST:1688-1901), as pure policy.

This module decides; it never touches a llama context. The caller (the slot) supplies the state sizes
it queried, fills the buffers `alloc` hands back, and restores a chosen entry's bytes through the two
callables given to `restore`. Keeping the policy pure lets every rule be tested without a model and
lets a UI replay or preview decisions.

Fidelity rules kept from the C++:
* the list is FIFO (oldest first, append at the back, evict from the front); a hit is removed on load,
  there is no LRU promotion;
* every ratio and the `update()` token estimate are computed in IEEE float32 with the same int->float
  conversions as the C++ (spec 0.2), so ties at 0.25 and between candidates resolve identically;
* sizes are the buffers' sizes as they are now (an entry whose `main` was freed by a half-failed
  restore keeps counting its draft and checkpoint bytes, as in the server); the cache keeps them as
  running totals, updated when an entry is appended or removed and when an entry's buffers are
  replaced (`CacheEntry` reports that to its cache), because re-summing every entry's sizes at each
  make-room / update step cost the simulator more than all its decisions (hundreds of entries);
* each decision is reported as a `CacheRecord` (kind, the server's own log line in `message`, empty
  when the server logs nothing, `level` TRC/WRN/ERR, `func` the C++ function whose `__func__`
  prefixes the line, and the fields). A cache built with `record=True` queues them, and its owner
  drains the queue after each call (`take_events()`, as SGLang's radix cache hands out its KV
  events), so no caller swaps a callback in and out; `on_event(kind, **fields)`, fixed at
  construction, hears each one as it is made (a standalone cache in a notebook or a figure).
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.prefix_index import PrefixIndex
from slotlab.engine.tokens import as_tokens, common_prefix

__all__ = [
    "Checkpoint",
    "CacheEntry",
    "CacheRecord",
    "EntryScore",
    "LoadResult",
    "PromptCache",
    "default_allocate",
    "f32",
    "f32_ratio",
]

from slotlab.units import MIB, cache_ram_bytes  # noqa: E402  (MIB re-exported: older imports read it here)

#: From this many entries on, a scan's lcps are scored as numpy arrays (`PromptCache._scan`); below
#: it, as lists (measured: arrays pay from ~100 entries, a small SWA model's cache holds ~150)
_ARRAYS = 96

#: The 0.25 floor of `load` ("don't trash large prompts"), as the C++ literal `0.25f`.
F_KEEP_FLOOR = np.float32(0.25)

Buffer = Any  # bytes, bytearray, memoryview, numpy uint8 array, ctypes c_uint8 array
EventSink = Callable[..., None]


def nbytes(buf: Buffer) -> int:
    """Byte length of a buffer, whatever its Python type (`std::vector<uint8_t>::size()`)."""
    n = getattr(buf, "nbytes", None)
    return int(n) if n is not None else len(buf)


def default_allocate(n: int) -> np.ndarray:
    """Zero-filled byte buffer, like `std::vector<uint8_t>::resize` on an empty vector."""
    return np.zeros(n, dtype=np.uint8)


def _empty_like(buf: Buffer) -> Buffer:
    """An empty buffer of the same family, for `data.clear(); data.shrink_to_fit()`."""
    if isinstance(buf, np.ndarray):
        return np.zeros(0, dtype=buf.dtype)
    return b""


def _copy_buffer(buf: Buffer) -> Buffer:
    """Deep copy for mutable buffers, sharing for immutable ones: `bytes`, and a buffer that says it
    is never written once filled (`immutable`: a paper memory's `PaperBlob`).

    The C++ copies the checkpoint vectors into the cache entry; sharing a mutable numpy array with the
    slot would let a later in-place update of the slot's checkpoint corrupt the cached one."""
    if isinstance(buf, bytes) or getattr(buf, "immutable", False):
        return buf
    if isinstance(buf, np.ndarray):
        return buf.copy()
    return bytes(buf)


def f32(n: int) -> np.float32:
    """C++ integer -> float conversion: a single round-to-nearest-even to float32.

    `np.float32(n)` for a huge Python int goes through float64 first (double rounding); exact below
    2**53, which is every realistic count, but cheap to do right above it too."""
    if -(1 << 53) <= n <= (1 << 53):
        return np.float32(float(n))
    sign = -1 if n < 0 else 1
    m = abs(n)
    shift = m.bit_length() - 24
    q, r = divmod(m, 1 << shift)
    half = 1 << (shift - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return np.float32(sign * float(q << shift))


_F32_EXACT = 1 << 24  # every integer up to this is a float32


def f32_ratio(num: int, den: int) -> np.float32:
    """`float(num) / den` with `den` a size_t: both operands become float32, then a float32 division.

    0/0 is NaN and x/0 is inf, silently, because the server relies on NaN comparing false.

    Where both are exact in float32 (token counts: every lcp / f_keep / f_sim the cache scores), the
    float64 quotient rounded once to float32 is that float32 division: a quotient correctly rounded to
    53 bits and then to 24 is correctly rounded to 24 (53 >= 2 * 24 + 2), and it is one numpy call
    instead of four (the RAM cache scores every entry twice a request)."""
    if 0 < den <= _F32_EXACT and -_F32_EXACT <= num <= _F32_EXACT:
        return np.float32(num / den)
    a, b = f32(num), f32(den)
    if b != 0:
        return a / b  # float32 / float32 (cannot overflow: |a| <= 2**64): no warning to silence
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.float32(a / b)


#: buffer types whose length does not change in place (what lets `Checkpoint.summary` be remembered);
#: subclasses count (a paper memory's `PaperBlob` is an ndarray)
_FIXED_LEN = (bytes, np.ndarray)


@dataclass(eq=False)
class Checkpoint:
    """`common_prompt_checkpoint` (CH:1232): a PARTIAL_ONLY state snapshot at `n_tokens` slot tokens.

    Only the sizes matter to the cache; `data_spec` (speculative state) exists in the C++ struct and
    counts in `size()`, it stays empty in slotlab.

    `summary()` (what a `slot_snapshot` lists per checkpoint, and `size()`) is computed once and
    remembered while the buffers are `bytes` or numpy arrays (a `PaperBlob` is one), whose lengths
    slotlab never changes in place (no `ndarray.resize`); assigning any field forgets it
    (`__setattr__`). Every snapshot of a slot lists all its checkpoints, and re-reading three buffer
    lengths per checkpoint per snapshot was ~8 % of a sliding-window or hybrid simulation. Other
    buffer types (a bytearray can be resized in place) are measured anew on every call."""

    n_tokens: int
    pos_min: int
    pos_max: int
    id_task: int = -1
    data_tgt: Buffer = b""
    data_dft: Buffer = b""
    data_spec: Buffer = b""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        self.__dict__.pop("_summary", None)  # a field or a buffer replaced: measured again

    def summary(self) -> tuple[int, int, int, int, int]:
        """(pos_min, pos_max, n_tokens, size(), id_task), as a `slot_snapshot` lists it."""
        d = self.__dict__
        s = d.get("_summary")
        if s is None:
            tgt, dft, spec = self.data_tgt, self.data_dft, self.data_spec
            s = (self.pos_min, self.pos_max, self.n_tokens, nbytes(tgt) + nbytes(dft) + nbytes(spec), self.id_task)
            if isinstance(tgt, _FIXED_LEN) and isinstance(dft, _FIXED_LEN) and isinstance(spec, _FIXED_LEN):
                d["_summary"] = s
        return s

    def size(self) -> int:
        return self.summary()[3]

    def empty(self) -> bool:
        return nbytes(self.data_tgt) == 0

    def copy(self) -> "Checkpoint":
        """Deep copy, as the C++ copies a `std::list<common_prompt_checkpoint>`.

        Made field by field rather than by `dataclasses.replace` (which looks the fields up on every
        call: every checkpoint of a slot is copied at each RAM-cache save). The copied buffers have
        the lengths of the originals, so a remembered `summary()` holds for the copy too."""
        c = object.__new__(type(self))
        d = c.__dict__
        d.update(self.__dict__)
        d["data_tgt"] = _copy_buffer(self.data_tgt)
        d["data_dft"] = _copy_buffer(self.data_dft)
        d["data_spec"] = _copy_buffer(self.data_spec)
        return c


@dataclass(eq=False)
class CacheEntry:
    """`server_prompt_cache_state`: a prompt (tokens + checkpoints) and its sequence state bytes.

    `main`/`drft` are the target/draft `llama_state_seq_get_data_ext` blobs. Entries compare by
    identity. `tokens` is a read-only copy: entries are immutable once cached (spec Appendix C).

    `size()` is computed once and remembered: a buffer's length never changes, and assigning `main`,
    `drft` or `checkpoints` (what `release_main` does) forgets it and tells the cache holding the
    entry, so the cache's running byte total follows. Mutating `checkpoints` in place is not seen."""

    tokens: np.ndarray
    checkpoints: list[Checkpoint]
    main: Buffer
    drft: Buffer
    id: int = -1
    id_slot: int = -1
    id_task: int = -1
    created_at: float = 0.0
    #: the t_last_used of the slot whose prompt it holds, when saved (refreshed when the same prompt is
    #: saved again): the order of the `--cache-ram-lru` proposal (slotlab/proposals), unused otherwise
    t_last: int = -1
    _size: Optional[int] = field(default=None, init=False, repr=False)
    _cache: Optional["PromptCache"] = field(default=None, init=False, repr=False)  # the cache holding it

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SIZED and "_cache" in self.__dict__:  # a buffer replaced after construction
            old = self.size()
            object.__setattr__(self, name, value)
            object.__setattr__(self, "_size", None)
            if self._cache is not None:
                self._cache._resized(self.size() - old)
            return
        object.__setattr__(self, name, value)

    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def size(self) -> int:
        """Bytes held: state blobs plus checkpoints, from the buffers as they are now."""
        n = self._size
        if n is None:
            n = nbytes(self.main) + nbytes(self.drft) + sum(c.size() for c in self.checkpoints)
            object.__setattr__(self, "_size", n)
        return n

    def release_main(self) -> None:
        """`data.main.clear(); shrink_to_fit()` after a successful target restore."""
        self.main = _empty_like(self.main)

    def release_drft(self) -> None:
        self.drft = _empty_like(self.drft)


_SIZED = frozenset(("main", "drft", "checkpoints"))
#: the RAM evictions whose entry goes to the disk tier (cache-disk proposal): the limits', not a hit's
#: ("loaded"), a superseded prefix's ("obsolete_prefix") or the lab's clear ("cleared")
_TO_DISK = frozenset(("make_room", "byte_limit", "token_limit", "shrink"))


@dataclass(frozen=True)
class EntryScore:
    """One line of `load`'s scan: the entry's lcp with the new prompt and its two ratios (float32)."""

    entry: CacheEntry
    n_tokens: int
    lcp: int
    f_keep: np.float32
    f_sim: np.float32
    below_floor: bool  # f_keep < 0.25: never considered
    improved: bool  # beat the running best on both axes at its turn of the scan
    winner: bool = False  # the final choice (the last entry that improved)


@dataclass(frozen=True)
class LoadResult:
    """Outcome of `PromptCache.load`: the winner (or None) and everything needed to explain why."""

    entry: Optional[CacheEntry]
    lcp_base: int
    f_keep_base: np.float32  # -1 for an empty slot
    f_sim_base: np.float32
    f_keep_best: np.float32
    f_sim_best: np.float32
    scores: tuple[EntryScore, ...]


@dataclass(frozen=True, slots=True)
class CacheRecord:
    """One decision of the cache, as the server logs it: `kind` (an event_types constant), `level`,
    `func` and `message` (the server's line), the entry and the load result it is about (objects,
    for the owner to describe), and the event's plain fields."""

    kind: str
    level: str
    func: str
    message: str
    entry: Optional["CacheEntry"] = None
    result: Optional["LoadResult"] = None
    fields: dict = field(default_factory=dict)


class PromptCache:
    """`server_prompt_cache`: FIFO list of cached prompts under a byte limit and a token limit.

    `limit_size` is bytes (0 = none); `limit_tokens` is tokens (0 = none; the server passes
    `llama_n_ctx`, so it is never 0 there). `allocate(nbytes)` produces a state buffer and may raise
    MemoryError, which takes the server's `std::bad_alloc` path. `clock` stamps `created_at`.
    `record=True` queues a `CacheRecord` per decision for `take_events()`; `on_event` hears each."""

    def __init__(
        self,
        limit_size: int,
        limit_tokens: int,
        *,
        allocate: Callable[[int], Buffer] = default_allocate,
        on_event: Optional[EventSink] = None,
        clock: Callable[[], float] = time.monotonic,
        record: bool = False,
        lru: bool = False,
        limit_tokens_entry: int = 0,
        disk_limit: int = 0,
    ) -> None:
        if limit_size < 0 or limit_tokens < 0:
            raise ValueError("limit_size and limit_tokens are size_t: they cannot be negative")
        self.limit_size = int(limit_size)
        self.limit_tokens = int(limit_tokens)
        #: proposals (slotlab/proposals): `lru` keeps the entries ordered by last use (--cache-ram-lru);
        #: `limit_tokens_entry` > 0 refuses an entry of more tokens (-kvcpc, PR #28046)
        self.lru = bool(lru)
        self.limit_tokens_entry = int(limit_tokens_entry)
        #: the cache-disk proposal (PR #28092): entries the limits push out of RAM go to a disk tier of
        #: `disk_limit` bytes (FIFO too), and `load` looks there after RAM; 0 = no disk tier (the server)
        self.disk_limit = int(disk_limit)
        self.disk: list[CacheEntry] = []
        self._disk_bytes = 0
        self._disk_size: dict[int, int] = {}  # entry id -> its bytes when written (a restore frees `main`)
        self.allocate = allocate
        self.on_event = on_event
        self._records: Optional[list[CacheRecord | None]] = [] if record else None
        #: `wants(kind)`: whether the owner draining the queue delivers records of `kind` (None: all);
        #: where it says no, the per-request lines are not built (see `_skips`)
        self.wants: Optional[Callable[[str], bool]] = None
        #: whether the per-entry lines are reported: `cache_load_score` (each entry's lcp / f_keep /
        #: f_sim at a load) and `cache_state_entry` (each entry at an update), the -lv 4 listing of the
        #: whole cache at every request, and the score table a `cache_load_scores` event carries (empty
        #: when off). They decide nothing; with ~140 entries they are ~290 events a request, so a reader
        #: that folds only the decisions (`slotlab simulate`) switches them off.
        self.per_entry = True
        self.clock = clock
        self.entries: list[CacheEntry] = []  # change it only through the methods: they keep the totals
        self._bytes = 0  # Σ entry.size() over `entries`
        self._tokens = 0  # Σ entry.n_tokens() over `entries`
        #: The token cap the last `update()` enforced (`limit_tokens_cur`); None before the first.
        self.limit_tokens_cur: Optional[int] = None
        self._next_id = 0
        self._lcp_memo: Optional[tuple[np.ndarray, dict]] = None  # see one_prompt()
        self._index = PrefixIndex()  # the entries sorted by tokens: every entry's lcp in a binary search

    @classmethod
    def from_cache_ram(cls, cache_ram_mib: int, n_ctx: int, **kwargs: Any) -> "PromptCache":
        """Build it the way `load_model` does from `--cache-ram` (MiB) and `llama_n_ctx` (SC:1332-1344):
        negative MiB = no byte limit. `--cache-ram 0` means no cache object at all, so it is refused."""
        if cache_ram_mib == 0:
            raise ValueError("--cache-ram 0 disables the prompt cache: create no PromptCache")
        return cls(cache_ram_bytes(cache_ram_mib), int(n_ctx), **kwargs)

    # -- totals -------------------------------------------------------------------------------

    def size(self) -> int:
        """Σ entry.size(): checkpoint bytes count here (a running total)."""
        return self._bytes

    def n_tokens(self) -> int:
        """Σ len(entry.tokens): checkpoints do not count here (a running total)."""
        return self._tokens

    def _added(self, e: CacheEntry, scanned: bool = False) -> None:
        """`scanned`: the index's last scan was of e's tokens (see `PrefixIndex.add`)."""
        object.__setattr__(e, "_cache", self)
        self._bytes += e.size()
        self._tokens += e.n_tokens()
        self._index.add(e, e.id, scanned)

    def _removed(self, e: CacheEntry) -> None:
        object.__setattr__(e, "_cache", None)
        self._bytes -= e.size()
        self._tokens -= e.n_tokens()
        self._index.remove(e)

    def _scan(self, tokens: np.ndarray) -> tuple[Any, Any]:
        """Every entry's lcp with `tokens` and its token count, in `entries` order: int64 arrays from
        `_ARRAYS` entries on, lists below (where numpy's calls cost more than the loops they save).

        The entries are appended in id order and leave it only by removal, so `entries` is in id
        order, and the index hands its scan in that order; the --cache-ram-lru proposal reorders
        them, and is looked up entry by entry."""
        idx = self._index
        out = idx.scan(tokens)
        if not self.lru and len(out) >= _ARRAYS:
            return idx.in_key_order(out)
        by_id = dict(zip(map(id, idx.sorted), out.tolist()))
        return [by_id[id(e)] for e in self.entries], [e.n_tokens() for e in self.entries]

    def _resized(self, delta: int) -> None:
        """An entry it holds had a buffer replaced (`CacheEntry.__setattr__`)."""
        self._bytes += delta

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def n_allocated(self) -> int:
        """How many entries were ever appended (the next one's id): it changes exactly when an entry
        is appended, so an allocator can tell the blobs of the entry being built from older ones."""
        return self._next_id

    # -- one prompt scored several times ---------------------------------------------------------

    @contextmanager
    def one_prompt(self, tokens: np.ndarray) -> Iterator[None]:
        """Within the block, `lcp(entry, tokens)` is computed once per entry for this `tokens` array (the
        same object, not changed meanwhile): the server scores one request's prompt against the same
        entries more than once (what it held, `load`, a preview), and entries never change."""
        prev = self._lcp_memo
        self._lcp_memo = (tokens, {})
        try:
            yield
        finally:
            self._lcp_memo = prev

    def lcp(self, entry: CacheEntry, tokens: np.ndarray) -> int:
        """`common_prefix(entry.tokens, tokens)`, remembered inside `one_prompt(tokens)`."""
        memo = self._lcp_memo
        if memo is None or memo[0] is not tokens:
            return common_prefix(entry.tokens, tokens)
        d = memo[1]
        v = d.get(entry)  # entries hash by identity; the memo holds them only while the block runs
        if v is None:
            v = d[entry] = common_prefix(entry.tokens, tokens)
        return v

    # -- events -------------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        """Whether the decisions are queued for `take_events()` (`record=True`)."""
        return self._records is not None

    @property
    def reporting(self) -> bool:
        """Whether anyone hears the decisions (a queue or a listener): the report-only sizes of
        `update()` are computed only then."""
        return self._records is not None or self.on_event is not None

    def take_events(self) -> list[CacheRecord | None]:
        """The records queued since the last call, oldest first (empty without `record=True`); None
        in the place of each record `wants` refused (`_skips`)."""
        if not self._records:
            return []
        out, self._records = self._records, []
        return out

    def _emit(self, kind: str, level: str, func: str, message: str, *, entry: Optional["CacheEntry"] = None,
              result: Optional["LoadResult"] = None, **fields: Any) -> None:
        if self._records is not None:
            self._records.append(CacheRecord(kind, level, func, message, entry, result, fields))
        if self.on_event is not None:
            extra = {k: v for k, v in (("entry", entry), ("result", result)) if v is not None}
            self.on_event(kind, level=level, func=func, message=message, **extra, **fields)

    def _skips(self, kind: str) -> bool:
        """True where nobody wants a record of `kind` (`wants`, set by the owner that drains the
        queue, says no and no listener hears it): the caller then builds neither its line nor its
        fields, and a placeholder (None) keeps its place in the queue, so that the owner numbers it
        where the event would have been. The per-request lines (the save, the look-up, the state)
        of a simulation nobody reads."""
        w = self.wants
        if w is None or self.on_event is not None or w(kind):
            return False
        if self._records is not None:
            self._records.append(None)
        return True

    def _evict_front(self, reason: str, level: str, func: str, message: str) -> None:
        e = self.entries.pop(0)
        self._removed(e)
        self._emit(T.CACHE_EVICT, level, func, message, reason=reason, entry=e, entry_id=e.id,
                   n_tokens=e.n_tokens(), size=e.size())
        if self.disk_limit > 0 and reason in _TO_DISK:
            self._to_disk(e)

    # -- the cache-disk proposal (PR #28092): a disk tier below RAM --------------------------------

    def _to_disk(self, e: CacheEntry) -> None:
        """An entry the RAM limits pushed out is written to the disk tier (its oldest make room)."""
        size = e.size()
        if size > self.disk_limit:
            return
        while self.disk and self._disk_bytes + size > self.disk_limit:
            old = self.disk.pop(0)
            n = self._disk_size.pop(old.id)
            self._disk_bytes -= n
            self._emit(T.CACHE_DISK_EVICT, "WRN", "disk", " - disk cache: removing oldest entry (size = %.3f MiB)"
                       % (n / MIB), entry=old, entry_id=old.id, n_tokens=old.n_tokens(), size=n)
        self.disk.append(e)
        self._disk_size[e.id] = size
        self._disk_bytes += size
        self._emit(T.CACHE_DISK_WRITE, "TRC", "disk", " - disk cache: wrote entry of %d tokens (%.3f MiB)"
                   % (e.n_tokens(), size / MIB), entry=e, entry_id=e.id, n_tokens=e.n_tokens(), size=size)

    def disk_size(self) -> int:
        return self._disk_bytes

    def _best_on_disk(self, tokens_new: np.ndarray, f_keep_best, f_sim_best):
        """`load`'s rule continued over the disk tier after RAM: an entry there wins only if strictly
        better on both than the best so far (RAM is scanned first: a tie stays in RAM)."""
        best = None
        n_new = int(tokens_new.shape[0])
        for e in self.disk:
            lcp = common_prefix(e.tokens, tokens_new)
            f_keep, f_sim = f32_ratio(lcp, e.n_tokens()), f32_ratio(lcp, n_new)
            if not f_keep < F_KEEP_FLOOR and f_keep_best < f_keep and f_sim_best < f_sim:
                best, f_keep_best, f_sim_best = e, f_keep, f_sim
        return best, f_keep_best, f_sim_best

    # -- alloc (ST:1711-1791) -----------------------------------------------------------------

    def alloc(
        self,
        tokens: Any,
        checkpoints: Sequence[Checkpoint],
        size_tgt: int,
        size_dft: int = 0,
        *,
        id_slot: int = -1,
        id_task: int = -1,
        created_at: Optional[float] = None,
        t_last: int = -1,
    ) -> Optional[CacheEntry]:
        """Make room for and append a new entry for a slot's prompt; None when it is not cached.

        Rule order is the server's (spec 2.3): dedupe, single-entry over-limit skip (before anything
        is evicted), removal of cached prefixes of the new prompt, FIFO make-room, allocation. On a
        failed allocation the removals already done stay done, the byte limit drops permanently to
        40 % of what is left, and `update()` runs. The caller fills `main`/`drft` of the result.

        Also emits the `prompt_save` line the server prints just before calling `alloc`.

        `t_last` is the saving slot's t_last_used: with `lru` (the --cache-ram-lru proposal) the entry is
        placed among the others by it (and a duplicate save refreshes the entry holding the prompt), so
        the evictions from the front take the least recently used; otherwise it is only recorded."""
        tokens = as_tokens(tokens)
        n_new = int(tokens.shape[0])
        size_tgt = int(size_tgt)
        size_dft = int(size_dft)

        if not self._skips(T.CACHE_SAVE):
            self._emit(
                T.CACHE_SAVE, "TRC", "prompt_save",
                " - saving prompt with length %d, total state size = %.3f MiB (draft: %.3f MiB)"
                % (n_new, (size_tgt + size_dft) / MIB, size_dft / MIB),
                n_tokens=n_new, size_tgt=size_tgt, size_dft=size_dft, id_slot=id_slot, id_task=id_task,
            )

        # every entry's lcp with the new prompt at once (prefix_index.py), in `entries` order
        lcps, n_es = self._scan(tokens)

        # 1. the new prompt is a prefix of (or equal to) an entry: it is already cached
        if isinstance(lcps, list):
            dup = [i for i, v in enumerate(lcps) if v == n_new][:1]
            obsolete = [i for i, (v, k) in enumerate(zip(lcps, n_es)) if v == k]
        else:
            dup = np.flatnonzero(lcps == n_new)[:1].tolist()
            obsolete = np.flatnonzero(lcps == n_es).tolist()
        if dup:
            e = self.entries[dup[0]]  # the first such entry, oldest first
            if self.lru:
                self._touch(e, t_last)
            self._emit(T.CACHE_SKIP_DUPLICATE, "TRC", "alloc",
                       " - prompt is already in the cache, skipping",
                       entry=e, entry_id=e.id, n_tokens=n_new)
            return None

        # the -kvcpc proposal (PR #28046): a per-entry token limit in place of the aggregate one
        if 0 < self.limit_tokens_entry < n_new:
            self._emit(T.CACHE_SKIP_ENTRY_LIMIT, "WRN", "alloc",
                       " - prompt with %d tokens exceeds the per-entry token limit %d, skipping"
                       % (n_new, self.limit_tokens_entry),
                       n_tokens=n_new, limit_tokens_entry=self.limit_tokens_entry)
            return None

        # 2-3. a single entry larger than the whole budget would only flush the cache for nothing
        size_new = size_tgt + size_dft + sum(c.size() for c in checkpoints)
        if self.limit_size > 0 and size_new > self.limit_size:
            self._emit(T.CACHE_SKIP_OVER_LIMIT, "WRN", "alloc",
                       " - prompt state size %.3f MiB exceeds cache size limit %.3f MiB, skipping"
                       % (size_new / MIB, self.limit_size / MIB),
                       size=size_new, limit_size=self.limit_size, n_tokens=n_new)
            return None

        # 4. entries that are prefixes of the new prompt are superseded by it
        if obsolete:
            gone = set(obsolete)
            for i in obsolete:
                e = self.entries[i]
                self._removed(e)
                self._emit(T.CACHE_EVICT, "TRC", "alloc",
                           " - removing obsolete cached prompt with length %d" % int(lcps[i]),
                           reason="obsolete_prefix", entry=e, entry_id=e.id,
                           n_tokens=e.n_tokens(), size=e.size())
            self.entries[:] = [e for i, e in enumerate(self.entries) if i not in gone]

        # 5. FIFO make-room so that the allocation never breaches the byte limit
        if self.limit_size > 0:
            while self.entries and self.size() + size_new > self.limit_size:
                self._evict_front(
                    "make_room", "WRN", "alloc",
                    " - making room for prompt cache entry, removing oldest entry (size = %.3f MiB)"
                    % (self.entries[0].size() / MIB))

        # 6. allocate; std::bad_alloc -> shrink the budget to 40 % of what is cached
        try:
            main = self.allocate(size_tgt)
            drft = self.allocate(size_dft)
        except MemoryError as exc:
            what = str(exc) or "std::bad_alloc"
            self._emit(T.CACHE_ALLOC_FAILED, "ERR", "alloc",
                       "failed to allocate memory for prompt cache state: %s" % what,
                       size_tgt=size_tgt, size_dft=size_dft, error=what)
            old = self.limit_size
            self.limit_size = max(1, int(0.4 * self.size()))  # double, truncated to size_t
            self._emit(T.CACHE_LIMIT_REDUCED, "WRN", "alloc",
                       " - cache size limit reduced to %.3f MiB" % (self.limit_size / MIB),
                       limit_size=self.limit_size, limit_size_old=old)
            self._update("shrink")
            return None

        # 7. append a deep copy of the prompt
        entry = CacheEntry(
            tokens=_readonly_copy(tokens),
            checkpoints=[c.copy() for c in checkpoints],
            main=main,
            drft=drft,
            id=self._next_id,
            id_slot=id_slot,
            id_task=id_task,
            created_at=self.clock() if created_at is None else float(created_at),
            t_last=int(t_last),
        )
        self._next_id += 1
        if self.lru:
            self._insert_by_last_use(entry)
        else:
            self.entries.append(entry)
        self._added(entry, scanned=True)  # (the index followed the removals since its scan)
        self._emit(T.CACHE_ALLOC, "TRC", "alloc", "", entry=entry, entry_id=entry.id,
                   n_tokens=n_new, size=entry.size(), id_slot=id_slot, id_task=id_task)
        return entry

    # -- the --cache-ram-lru proposal: entries ordered by last use ------------------------------

    def _place_of(self, t_last: int) -> int:
        """Before the first entry used later than `t_last` (equal ones keep their insertion order)."""
        for i, e in enumerate(self.entries):
            if e.t_last > t_last:
                return i
        return len(self.entries)

    def _insert_by_last_use(self, entry: CacheEntry) -> None:
        i = self._place_of(entry.t_last)
        self.entries.insert(i, entry)
        if i < len(self.entries) - 1:
            self._emit(T.CACHE_LRU_PLACED, "TRC", "alloc",
                       " - prompt cache LRU: entry with t_last = %d placed at %d of %d"
                       % (entry.t_last, i, len(self.entries)),
                       entry=entry, entry_id=entry.id, t_last=entry.t_last, position=i, n_entries=len(self.entries))

    def _touch(self, entry: CacheEntry, t_last: int) -> None:
        """A save of a prompt `entry` already holds: it was used at `t_last`, so it moves by it."""
        entry.t_last = max(entry.t_last, int(t_last))
        self.entries.remove(entry)
        i = self._place_of(entry.t_last)
        self.entries.insert(i, entry)
        if i < len(self.entries) - 1:
            self._emit(T.CACHE_LRU_PLACED, "TRC", "alloc",
                       " - prompt cache LRU: entry with t_last = %d placed at %d of %d"
                       % (entry.t_last, i, len(self.entries)),
                       entry=entry, entry_id=entry.id, t_last=entry.t_last, position=i, n_entries=len(self.entries))

    # -- load (ST:1793-1868) ------------------------------------------------------------------

    def load(self, slot_tokens: Any, tokens_new: Any, *, emit: bool = True) -> LoadResult:
        """Pick the entry to restore into a slot about to process `tokens_new`, or none.

        Baseline = what the slot already holds (f_keep -1 for an empty slot, so any entry passing the
        floor wins). Entries are scanned oldest -> newest; an entry below the 0.25 f_keep floor is
        skipped ("don't trash large prompts"); otherwise it becomes the best only if it is strictly
        better on both f_keep and f_sim than the running best. This sequential test is order
        dependent (spec Appendix B) and is kept as is. Nothing is removed here: see `restore`/`take`.
        `emit=False` scores silently (a preview for a UI; the server logs nothing then)."""
        report = emit and self.reporting
        slot_tokens = as_tokens(slot_tokens)
        tokens_new = as_tokens(tokens_new)
        n_slot = int(slot_tokens.shape[0])
        n_new = int(tokens_new.shape[0])

        lcp_base = common_prefix(slot_tokens, tokens_new)
        f_keep_base = f32_ratio(lcp_base, n_slot) if n_slot > 0 else np.float32(-1.0)
        f_sim_base = f32_ratio(lcp_base, n_new)
        if report and not self._skips(T.CACHE_LOAD_BASE):
            self._emit(T.CACHE_LOAD_BASE, "TRC", "load",
                       " - looking for better prompt, base f_keep = %.3f, f_sim = %.3f"
                       % (float(f_keep_base), float(f_sim_base)),
                       lcp=lcp_base, f_keep=f_keep_base, f_sim=f_sim_base, n_tokens=n_slot)

        f_keep_best, f_sim_best = f_keep_base, f_sim_base
        best: Optional[CacheEntry] = None
        scores: list[EntryScore] = []
        if report and not self.per_entry:  # nobody reads the per-entry table: the same choice, faster
            best, f_keep_best, f_sim_best = self._best_entry(tokens_new, f_keep_base, f_sim_base)
        for e in self.entries if (not report or self.per_entry) else ():
            n_e = e.n_tokens()
            lcp = self.lcp(e, tokens_new)
            f_keep = f32_ratio(lcp, n_e)
            f_sim = f32_ratio(lcp, n_new)
            if report and self.per_entry:
                self._emit(T.CACHE_LOAD_SCORE, "TRC", "load",
                           "   - prompt with length %7d, lcp = %7d, f_keep = %.3f, f_sim = %.3f"
                           % (n_e, lcp, float(f_keep), float(f_sim)),
                           entry=e, entry_id=e.id, n_tokens=n_e, lcp=lcp, f_keep=f_keep, f_sim=f_sim)
            below = bool(f_keep < F_KEEP_FLOOR)
            improved = (not below) and bool(f_keep_best < f_keep) and bool(f_sim_best < f_sim)
            if improved:
                f_keep_best, f_sim_best, best = f_keep, f_sim, e
            scores.append(EntryScore(e, n_e, lcp, f_keep, f_sim, below, improved))

        if self.disk:
            on_disk, fk, fs = self._best_on_disk(tokens_new, f_keep_best, f_sim_best)
            if on_disk is not None:
                best, f_keep_best, f_sim_best = on_disk, fk, fs
        scores = [dataclasses.replace(s, winner=True) if s.entry is best and best is not None else s
                  for s in scores]
        result = LoadResult(best, lcp_base, f_keep_base, f_sim_base, f_keep_best, f_sim_best,
                            tuple(scores))
        if not report:
            return result
        if best is not None and not self._skips(T.CACHE_LOAD_FOUND):
            self._emit(T.CACHE_LOAD_FOUND, "TRC", "load",
                       " - found better prompt with f_keep = %.3f, f_sim = %.3f"
                       % (float(f_keep_best), float(f_sim_best)),
                       entry=best, entry_id=best.id, f_keep=f_keep_best, f_sim=f_sim_best)
        if not self._skips(T.CACHE_LOAD_SCORES):
            self._emit(T.CACHE_LOAD_SCORES, "TRC", "load", "", result=result,
                       winner_id=None if best is None else best.id)
        return result

    def _best_entry(self, tokens_new: np.ndarray, f_keep_base: np.float32,
                    f_sim_base: np.float32) -> tuple[Optional[CacheEntry], np.float32, np.float32]:
        """`load`'s scan without its per-entry table (`per_entry` off: `slotlab simulate`, where the
        cache holds ~150 entries and this runs for every request). The ratios are the same float32
        divisions done on arrays (one rounding of a float32 quotient, NaN for 0/0), and the sequential
        test runs on their exact values as Python floats (a float32 is a double exactly, so every
        comparison, NaN's included, comes out as in float32). The lcps come from the entries'
        lexicographic index (prefix_index.py): a binary search, not one comparison per entry."""
        entries = self.entries
        if not entries:
            return None, f_keep_base, f_sim_base
        lc, ns = self._scan(tokens_new)  # (entries change only through the methods, which keep the index)
        lcps = np.asarray(lc, dtype=np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            f_keeps = lcps / np.asarray(ns, dtype=np.float32)
            f_sims = lcps / np.float32(tokens_new.shape[0])
        floor = float(F_KEEP_FLOOR)
        kb, sb = float(f_keep_base), float(f_sim_base)
        win = -1
        if isinstance(lc, list):
            cand = range(len(lc))
            fkl, fsl = f_keeps.tolist(), f_sims.tolist()
        else:
            # the best so far only rises, so an entry not above the base on both axes never improves:
            # the sequential test runs on the others only (NaN compares false here as there)
            cand = np.flatnonzero((kb < f_keeps) & (sb < f_sims) & ~(f_keeps < np.float32(floor))).tolist()
            fkl, fsl = f_keeps[cand].tolist(), f_sims[cand].tolist()
        for i, fk, fs in zip(cand, fkl, fsl):
            if not fk < floor and kb < fk and sb < fs:
                kb, sb, win = fk, fs, i
        if win < 0:
            return None, f_keep_base, f_sim_base
        return entries[win], np.float32(kb), np.float32(sb)

    def restore(
        self,
        entry: CacheEntry,
        set_tgt: Callable[[Buffer], int],
        set_dft: Optional[Callable[[Buffer], int]] = None,
    ) -> bool:
        """The restoring half of the server's `load` for the winner, with the context calls injected.

        `set_tgt(buf)` / `set_dft(buf)` must return what `llama_state_seq_set_data_ext` returns (bytes
        read; anything else than `len(buf)` is a failure). On success the entry is taken out of the
        cache (remove-on-load) and the caller moves its tokens and checkpoints into the slot. Exactly
        as in the C++, a failed draft restore leaves the entry cached with its `main` already freed."""
        size = nbytes(entry.main)
        if set_tgt(entry.main) != size:
            self._emit(T.CACHE_RESTORE_FAILED, "ERR", "load",
                       "failed to restore state with size %d" % size,
                       entry=entry, entry_id=entry.id, which="tgt", size=size)
            return False
        entry.release_main()

        if nbytes(entry.drft) > 0:
            if set_dft is None:  # GGML_ASSERT(ctx_dft) in the server
                raise AssertionError("cache entry has draft state but no draft context was given")
            size = nbytes(entry.drft)
            if set_dft(entry.drft) != size:
                self._emit(T.CACHE_RESTORE_FAILED, "WRN", "load",
                           "failed to restore state with size %d" % size,
                           entry=entry, entry_id=entry.id, which="dft", size=size)
                return False
            entry.release_drft()

        self.take(entry)
        return True

    def take(self, entry: CacheEntry) -> CacheEntry:
        """Remove `entry` from the cache and return it (remove-on-load: a hit is never kept)."""
        for i, e in enumerate(self.disk):  # the disk tier's: read back (it left RAM's totals already)
            if e is entry:
                del self.disk[i]
                n = self._disk_size.pop(entry.id)
                self._disk_bytes -= n
                self._emit(T.CACHE_DISK_LOAD, "TRC", "load", " - disk cache: read entry of %d tokens (%.3f MiB)"
                           % (entry.n_tokens(), n / MIB), entry=entry, entry_id=entry.id,
                           n_tokens=entry.n_tokens(), size=n)
                return entry
        for i, e in enumerate(self.entries):
            if e is entry:
                del self.entries[i]
                self._removed(entry)
                break
        else:
            raise KeyError(f"cache entry {entry.id} is not in the cache")
        self._emit(T.CACHE_EVICT, "TRC", "load", "", reason="loaded", entry=entry, entry_id=entry.id,
                   n_tokens=entry.n_tokens(), size=entry.size())
        return entry

    def clear(self) -> int:
        """Evict every entry, oldest first (reason "cleared"), then `update()`: a lab control, the
        server has no such call. Returns how many entries were dropped."""
        n = len(self.entries)
        while self.entries:
            self._evict_front("cleared", "TRC", "clear", "")
        self.update()
        return n

    # -- update (ST:1870-1901) ----------------------------------------------------------------

    def update(self) -> int:
        """Enforce the byte limit, then the token limit, FIFO; return the token cap used.

        The token cap is `max(limit_tokens, limit_size / average bytes per token)` (float32, truncated),
        so a byte budget can only raise it above `n_ctx`; without a byte budget `n_ctx` is a hard cap
        on the total tokens cached. Note that `alloc` only guarantees the byte limit: the token limit
        waits for the next `update()`."""
        return self._update("byte_limit")

    def _update(self, _byte_reason: str) -> int:
        """`update()`; `_byte_reason` labels the byte-limit evictions ("shrink" after a failed alloc)."""
        if self.limit_size > 0:
            while self.entries and self.size() > self.limit_size:
                self._evict_front(
                    _byte_reason, "WRN", "update",
                    " - cache size limit reached, removing oldest entry (size = %.3f MiB)"
                    % (self.entries[0].size() / MIB))

        limit_tokens_cur = self.token_limit_estimate()
        self.limit_tokens_cur = limit_tokens_cur

        if self.limit_tokens > 0:
            while self.entries and self.n_tokens() > limit_tokens_cur:
                self._evict_front(
                    "token_limit", "WRN", "update",
                    " - cache token limit (%d, est: %d) reached, removing oldest entry (size = %.3f MiB)"
                    % (self.limit_tokens, limit_tokens_cur, self.entries[0].size() / MIB))

        if not self.reporting or self._skips(T.CACHE_STATE):  # nothing to report
            return limit_tokens_cur
        size = self.size()  # the running total (the listing below gives each entry's own)
        self._emit(T.CACHE_STATE, "TRC", "update",
                   " - cache state: %d prompts, %.3f MiB (limits: %.3f MiB, %d tokens, %d est)"
                   % (len(self.entries), size / MIB, self.limit_size / MIB,
                      self.limit_tokens, limit_tokens_cur),
                   n_entries=len(self.entries), size=size, n_tokens=self.n_tokens(),
                   limit_size=self.limit_size, limit_tokens=self.limit_tokens,
                   limit_tokens_cur=limit_tokens_cur)
        for e in self.entries if self.per_entry else ():
            n_e, e_size = e.n_tokens(), e.size()
            self._emit(T.CACHE_STATE_ENTRY, "TRC", "update",
                       "   - prompt 0x%012x: %7d tokens, checkpoints: %2d, %9.3f MiB"
                       % (e.id, n_e, len(e.checkpoints), e_size / MIB),
                       entry=e, entry_id=e.id, n_tokens=n_e,
                       n_checkpoints=len(e.checkpoints), size=e_size)
        return limit_tokens_cur

    def size_per_token(self) -> np.float32:
        """`max(1.0f, float(size()) / max(1, n_tokens()))` in float32."""
        spt = f32_ratio(self.size(), max(1, self.n_tokens()))
        one = np.float32(1.0)
        return spt if one < spt else one  # std::max(a, b) == (a < b) ? b : a

    def token_limit_estimate(self) -> int:
        """`limit_tokens_cur` for the current contents (what `update()` would enforce now)."""
        if self.limit_size <= 0:
            return self.limit_tokens
        est = np.float32(f32(self.limit_size) / self.size_per_token())
        return max(self.limit_tokens, int(est))  # float -> size_t truncates


def _readonly_copy(tokens: np.ndarray) -> np.ndarray:
    out = np.array(tokens, dtype=np.int32, copy=True)
    out.flags.writeable = False
    return out
