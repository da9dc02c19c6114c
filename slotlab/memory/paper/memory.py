"""`PaperMemory`: the `Memory` interface (memory/base.py) on paper, for the simulator.

It owns the target context and the optional draft context (context.py), the placeholder vocabulary
(vocab.py) and the state blobs (blob.py), and adds what the interface asks beyond one context:
sequence-id checks, slot files (`save_file` / `load_file`, real llama.cpp sequence files with the
tensor data as holes), the sampler, the draft, and the bulk paths the simulator's fast-forward
uses (`advance_generation`, `advance_steps`)."""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from slotlab.errors import ConfigError, ShiftNotSupported
from slotlab.memory.base import SEQ_RM_FULL, SEQ_RM_PART, Batch, MemoryInfo
from slotlab.memory.paper.blob import PaperBlob
from slotlab.memory.paper.cells import CountCache
from slotlab.memory.paper.context import PaperContext, split_equal_spans, step_batch
from slotlab.memory.paper.format import (IO_MAGIC, LLAMA_MAX_SEQ, N_POSITIONS, POSITIONS, STATE_SEQ_MAGIC,
                                         STATE_SEQ_VERSION, Source, pad)
from slotlab.memory.paper.vocab import PaperSampler, PaperVocab, mix, outside
from slotlab.memory.profile import GGML_TYPES, ModelProfile

__all__ = ["PaperMemory", "paper_sizes"]

class PaperMemory:
    """`Memory` on paper for `profile` (and `draft`, the `-md` model's profile; `draft=True` = the
    target's). The arguments are llama-server's: `n_ctx` (-c; 0 = the training context), `n_slots`
    (-np), `kv_unified` (-kvu), `swa_full` (--swa-full), `n_batch` (-b), `n_ubatch` (-ub),
    `kv_unified_per_slot` (--kv-unified-per-slot), `type_k` / `type_v` (-ctk / -ctv, default f16),
    `flash_attn` ("auto" | "on" | "off": off transposes V, which only changes the byte layout).

    `seed` varies the placeholder tokens; `draft_acceptance` is the probability that a drafted token
    equals what the target then samples (deterministic per position). `vocab`: a real vocabulary to use
    instead of `PaperVocab` (token ids are still opaque to the memory)."""

    def __init__(self, profile: ModelProfile, *, n_ctx: int = 0, n_slots: int = 1, kv_unified: bool = False,
                 swa_full: bool = False, n_batch: int = 2048, n_ubatch: int = 512, kv_unified_per_slot: int = 0,
                 draft: ModelProfile | bool | None = None, n_draft: int = 0, type_k: str = "f16",
                 type_v: str = "f16", flash_attn: str = "auto", vocab: Any = None, seed: int = 0,
                 draft_acceptance: float = 0.75):
        for name, v in (("n_ctx", n_ctx), ("n_slots", n_slots), ("n_batch", n_batch), ("n_ubatch", n_ubatch)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ConfigError(f"{name} must be an integer, got {v!r}")
        if not 1 <= n_slots <= LLAMA_MAX_SEQ:
            raise ConfigError(f"n_parallel (-np/--parallel) must be in 1..{LLAMA_MAX_SEQ}, got {n_slots}")
        if n_ctx < 0:
            raise ConfigError(f"n_ctx (-c/--ctx-size) must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_batch < 1 or n_ubatch < 1:
            raise ConfigError(f"n_batch (-b) and n_ubatch (-ub) must be >= 1, got {n_batch} and {n_ubatch}")
        for t in (type_k, type_v):
            if t not in GGML_TYPES:
                raise ConfigError(f"unknown KV cache type {t!r} (one of {', '.join(GGML_TYPES)})")
        if flash_attn not in ("auto", "on", "off"):
            raise ConfigError(f"flash_attn must be auto, on or off, got {flash_attn!r}")
        v_trans = flash_attn == "off"  # AUTO creates the cache with flash attention on (v_trans = false)
        if v_trans and GGML_TYPES[type_v][1] > 1:
            raise ConfigError("quantized V cache requires flash_attn to be enabled")
        self.profile = profile
        n_ctx_req = n_ctx or profile.n_ctx_train
        # llama_context: batch sizes from the requested n_ctx, then n_ctx padded to 256 and split per sequence
        n_batch_eff = min(n_ctx_req, n_batch)
        n_ubatch_eff = min(n_batch_eff, n_ubatch)
        n_ctx_pad = pad(n_ctx_req)
        if kv_unified:
            n_ctx_seq = n_ctx_pad
        else:
            n_ctx_seq = pad(n_ctx_pad // n_slots)
            n_ctx_pad = n_ctx_seq * n_slots
        if n_ctx_seq > profile.n_ctx_train:  # as llama.cpp: a warning, and each slot is capped below
            logging.getLogger("slotlab.memory").warning(
                "n_ctx_seq (%d) > n_ctx_train (%d) -- possible training context overflow", n_ctx_seq,
                profile.n_ctx_train)
        self.n_ctx, self.n_ctx_seq = n_ctx_pad, n_ctx_seq
        self.n_batch, self.n_ubatch = n_batch_eff, n_ubatch_eff
        self.kv_unified, self.swa_full = bool(kv_unified), bool(swa_full)
        kw = dict(n_ctx_seq=n_ctx_seq, n_seq_max=n_slots, unified=self.kv_unified, swa_full=self.swa_full,
                  n_ubatch=n_ubatch_eff, type_k=type_k, type_v=type_v, v_trans=v_trans)
        self.tgt = PaperContext(profile, **kw)
        if draft is True:
            draft = profile
        self.draft_profile = draft or None
        self.dft = None
        if self.draft_profile is not None:
            if self.draft_profile.n_vocab != profile.n_vocab:
                raise ConfigError(f"the draft vocabulary ({self.draft_profile.n_vocab} tokens) does not match the "
                                  f"target's ({profile.n_vocab}): draft model vocab type must match target model")
            self.dft = PaperContext(self.draft_profile, **kw)
        n_ctx_slot = n_ctx_seq
        if kv_unified_per_slot > 0:
            n_ctx_slot = min(n_ctx_slot, kv_unified_per_slot)
        n_ctx_slot = min(n_ctx_slot, profile.n_ctx_train)
        self.vocab = vocab if vocab is not None else PaperVocab(max(profile.n_vocab, 4))
        #: the placeholder vocabulary the sampler and the draft draw from (`vocab` itself unless a real one is given)
        self.gen_vocab = self.vocab if isinstance(self.vocab, PaperVocab) else PaperVocab(max(profile.n_vocab, 4))
        self.n_vocab = profile.n_vocab
        self.info = MemoryInfo(
            n_ctx=self.n_ctx, n_seq_max=n_slots, n_ctx_slot=n_ctx_slot, n_batch=self.n_batch, n_ubatch=self.n_ubatch,
            n_swa=0 if swa_full else profile.n_swa, kv_unified=self.kv_unified,
            can_shift=self.tgt.can_shift, has_draft=self.dft is not None, n_vocab=profile.n_vocab,
            # common_context_can_seq_rm's probe: a recurrent state cannot drop its last position (n_rs_seq 0)
            seq_rm_type=SEQ_RM_PART if self.tgt.kind == "kv" else SEQ_RM_FULL)
        self.n_draft = n_draft
        self.seed = int(seed)
        self.draft_acceptance = float(draft_acceptance)
        # the rows of the last successful target decode: (tokens, positions, logits requested), or the
        # last bulk step's (runs, logit rows), made into those arrays only when a sample reads them
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[Sequence, Sequence] | None = None
        self.stats = {"decode": 0, "decode_tokens": 0, "decode_full": 0, "decode_draft": 0, "state_get": 0,
                      "state_set": 0}
        # read-only token arrays found inside the vocabulary, by id (the array itself kept, so the id
        # cannot be reused): a prompt's chunks are views of its tokens, checked once (`_bulk_steps`)
        self._in_vocab: dict[int, np.ndarray] = {}

    # -- construction from llama-server flags ---------------------------------------------------------

    @classmethod
    def from_params(cls, params, *, profile: ModelProfile | None = None, draft_profile: ModelProfile | None = None,
                    **kw) -> "PaperMemory":
        """A paper memory for parsed llama-server flags (a `slotlab.engine.params.ServerParams`: the
        engine parses the command line, the memory only reads the fields), as
        `slotlab.engine.backend.load` would create the contexts. `profile` defaults to the GGUF at
        `-m` (the embedded default model without -m); the draft to the GGUF at `-md` when
        `--spec-type draft-simple` is on (the same profile when -md names the same file)."""
        from slotlab.memory.profile import default_model_gguf

        if isinstance(params, (str, list, tuple)):
            raise TypeError("PaperMemory.from_params takes parsed flags: ServerParams.from_args(flags)")
        if profile is None:
            profile = ModelProfile.from_gguf(params.model or default_model_gguf())
        draft = None
        if params.speculative:
            if draft_profile is not None:
                draft = draft_profile
            else:
                target = Path(params.model) if params.model else default_model_gguf()
                same = Path(params.model_draft).resolve() == target.resolve()
                draft = profile if same else ModelProfile.from_gguf(params.model_draft)
        return cls(profile, n_ctx=params.n_ctx_requested, n_slots=params.n_slots,
                   kv_unified=params.kv_unified_effective, swa_full=params.swa_full, n_batch=params.n_batch,
                   n_ubatch=params.n_ubatch, kv_unified_per_slot=params.kv_unified_per_slot, draft=draft,
                   n_draft=params.draft_max if params.speculative else 0, type_k=params.cache_type_k,
                   type_v=params.cache_type_v, flash_attn=params.flash_attn, **kw)

    # -- helpers ----------------------------------------------------------------------------------------

    def _check_seq(self, seq: int, allow_all: bool = False) -> None:
        if allow_all and seq == -1:
            return
        if not 0 <= seq < self.info.n_seq_max:
            raise ValueError(f"sequence id {seq} outside 0..{self.info.n_seq_max - 1}")

    def _ctxs(self):
        return (self.tgt,) if self.dft is None else (self.tgt, self.dft)

    def _pick(self, draft: bool) -> PaperContext:
        if draft and self.dft is None:
            raise ValueError("no draft context (-md) in this memory")
        return self.dft if draft else self.tgt

    def vocab_gen(self, token: int, pos: int, seed: int) -> int:
        """The placeholder sampled after `token` at `pos` with a sampler of seed `seed`."""
        return self.gen_vocab.generated(token, pos, seed ^ self.seed)

    def last_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(tokens, positions, logits requested) of the rows of the last successful target decode
        (None before one); a bulk prompt step's are made from its runs here, when first read."""
        rows = self._last
        if rows is not None and len(rows) == 2:  # a bulk step's runs (advance_steps)
            runs, want_rows = rows
            tok, pos, _ = step_batch(runs)
            want = np.zeros(len(tok), dtype=np.int8)
            want[list(want_rows)] = 1
            rows = self._last = (tok, pos, want)
        return rows

    def last_row(self, i: int) -> tuple[int, int]:
        """(token, position) of row `i` of the last successful target decode, which must have
        requested logits for it (as `llama_get_logits_ith` requires); ValueError otherwise."""
        rows = self.last_rows()
        if rows is None or not 0 <= i < len(rows[0]):
            raise ValueError(f"no logits for batch index {i} of the last decode")
        tok, pos, logits = rows
        if not logits[i]:
            raise ValueError(f"no logits for batch index {i} (was logits requested for it?)")
        return int(tok[i]), int(pos[i])

    def sample_row(self, i: int, seed: int) -> int:
        """What a `PaperSampler` of seed `seed` samples from row `i` of the last decode."""
        tok, pos = self.last_row(i)
        return self.vocab_gen(tok, pos, seed)

    # -- sequence operations ----------------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        self._check_seq(seq, allow_all=True)
        return all([c.seq_rm(seq, p0, p1) for c in self._ctxs()])

    def seq_rm_draft(self, seq: int, p0: int, p1: int) -> bool:
        self._check_seq(seq, allow_all=True)
        return self._pick(True).seq_rm(seq, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._check_seq(seq)
        for c in self._ctxs():
            if not c.can_shift:
                raise ShiftNotSupported(
                    "this context cannot shift KV positions (llama_memory_can_shift is false: "
                    + ("SWA model without --swa-full" if c.iswa and not self.swa_full else "memory type")
                    + "); cache reuse is not supported")
        for c in self._ctxs():
            c.seq_add(seq, p0, p1, delta)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        for c in self._ctxs():
            c.seq_cp(src, dst)

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq)
        for c in self._ctxs():
            c.seq_keep(seq)

    def pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return self.tgt.pos_min(seq)

    def pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return self.tgt.pos_max(seq)

    def clear(self) -> None:
        """`llama_memory_clear` on every context."""
        for c in self._ctxs():
            c.clear()

    # -- state blobs --------------------------------------------------------------------------------------

    def state_size(self, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        self._check_seq(seq)
        return self._pick(draft).state_size(seq, partial)

    def state_get(self, seq: int, *, draft: bool = False, partial: bool = False, out: Any = None):
        """The sequence's state: a `PaperBlob` of the real size (into `out` when it is one of at least
        that size). A plain numpy uint8 `out` gets the real byte format (tensor data zero)."""
        self._check_seq(seq)
        ctx = self._pick(draft)
        self.stats["state_get"] += 1
        if out is not None and not isinstance(out, PaperBlob) and isinstance(out, np.ndarray):
            w = ctx.writer(seq, partial)
            if len(out) < w.n:
                out = np.empty(w.n, dtype=np.uint8)
            w.into(out)
            return out[:w.n]
        payload = ctx.payload(seq, partial)
        if isinstance(out, PaperBlob) and len(out) >= payload.size:
            if out.payload is not None:  # (blobs are written once: copies share them)
                raise ValueError("state_get(out=): the blob holds a state already; give a new buffer")
            out.payload = payload
            return out if len(out) == payload.size else out[:payload.size]
        return PaperBlob(payload.size, payload)

    def state_bytes(self, seq: int, *, draft: bool = False, partial: bool = False) -> np.ndarray:
        """The state in llama.cpp's byte format (K/V data zero): loadable by a real context of the
        same model and configuration (llama_state_seq_set_data_ext)."""
        self._check_seq(seq)
        w = self._pick(draft).writer(seq, partial)
        out = np.empty(w.n, dtype=np.uint8)
        w.into(out)
        return out

    def state_set(self, data: Any, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        """Restore a blob into `seq`: bytes read (its length) or 0 (the sequence is then empty in the
        cache that refused it, as in llama.cpp)."""
        self._check_seq(seq)
        ctx = self._pick(draft)
        self.stats["state_set"] += 1
        if isinstance(data, PaperBlob):
            p = data.payload
            if p is None or len(data) < p.size:
                return 0  # an unfilled buffer: wrong magic
            if p.key != ctx.key(partial):
                ctx.restore(seq, partial, None, n_ok=0)
                return 0
            return p.size if ctx.restore(seq, partial, p.parts) else 0
        buf = _as_u8(data)
        if len(buf) < 8 or int(buf[:4].view("<u4")[0]) != IO_MAGIC:
            return 0
        end = ctx.read_real(buf, 8, seq, partial)
        return end

    def save_file(self, path, seq: int, tokens: np.ndarray) -> int:
        """`llama_state_seq_save_file`: magic, version, token count, tokens, state — the K/V data as
        holes (a sparse file of the real size). Returns the bytes written."""
        self._check_seq(seq)
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        w = self.tgt.writer(seq, False, header=False)
        try:
            with open(path, "wb") as f:
                f.write(struct.pack("<III", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(toks)))
                f.write(toks.tobytes())
                w.to_file(f)
                f.truncate(12 + 4 * len(toks) + w.n)
        except OSError:
            return 0
        return 12 + 4 * len(toks) + w.n

    def load_file(self, path, seq: int) -> tuple[int, np.ndarray]:
        """`llama_state_seq_load_file`: (bytes read, token payload), (0, []) when refused. Reads real
        llama.cpp sequence files too (positions are restored, tensor data skipped)."""
        self._check_seq(seq)
        empty = np.empty(0, dtype=np.int32)
        try:
            with open(path, "rb") as f:
                head = f.read(12)
                if len(head) < 12:
                    return 0, empty
                magic, version, n = struct.unpack("<III", head)
                if magic != STATE_SEQ_MAGIC or version != STATE_SEQ_VERSION:
                    return 0, empty
                raw = f.read(4 * n)
                if len(raw) < 4 * n:
                    return 0, empty
                toks = np.frombuffer(raw, dtype="<i4").astype(np.int32)
                end = self.tgt.read_real(Source(f=f), 12 + 4 * n, seq, False)
        except OSError:
            return 0, empty
        if end == 0:
            return 0, empty
        return end, toks

    # -- decoding -----------------------------------------------------------------------------------------

    def _decode(self, ctx: PaperContext, batch: Batch, off: int, n: int) -> int:
        if off < 0 or n < 0 or off + n > batch.n_tokens:
            raise ValueError(f"batch view [{off}, {off + n}) outside [0, {batch.n_tokens})")
        if n > self.n_batch:
            raise ValueError(f"decode of {n} tokens exceeds n_batch {self.n_batch}: decode in chunks")
        tok = batch.token[off:off + n]
        pos = batch.pos[off:off + n]
        seq = batch.seq[off:off + n]
        return ctx.decode(tok, pos, seq, self.n_ubatch, self.n_vocab)

    def decode(self, batch: Batch, off: int, n: int) -> int:
        ret = self._decode(self.tgt, batch, off, n)
        self.stats["decode"] += 1
        if ret == 0:
            self.stats["decode_tokens"] += n
            self._last = (batch.token[off:off + n].copy(), batch.pos[off:off + n].copy(),
                          batch.logits[off:off + n].copy())
        elif ret == 1:
            self.stats["decode_full"] += 1
        return ret

    # -- fast path for the simulator (slotlab/sim/fastforward.py) -------------------------------------

    def advance_generation(self, seqs: Sequence[int], pos0: Sequence[int], feed: np.ndarray) -> int:
        """Up to `k = len(feed)` generation steps at once, each exactly one successful `decode` of a
        batch with one token per sequence: step j decodes `feed[j, c]` at position `pos0[c] + j` for
        sequence `seqs[c]` (batch order = `seqs` order, logits requested for every row).

        Returns how many steps `m <= k` were applied: the steps before the first that `decode` would
        refuse (no free cells: it would return 1, and the server would purge or halve the batch), or
        0 when the first step is not a plain continuation of every sequence (then nothing changed).
        Afterwards the memory is exactly what m `decode` calls would have left (cells, window pruning,
        `pos_min` / `pos_max`, `stats["decode"]` / `["decode_tokens"]`, the rows `sample` reads).

        Applied in bulk by `PaperContext.advance_tokens` (count caches: free cells decide; a window
        cache: its cell reuse and purges replayed on Python lists; the recurrent part: the last
        position); a window cache shared by several generating sequences (unified) runs the real
        per-step decode, only without the server around it. Target context only: a memory with a
        draft returns 0."""
        feed = np.asarray(feed, dtype=np.int32)
        if feed.ndim != 2 or feed.shape[0] == 0 or self.dft is not None:
            return 0
        k, b = feed.shape
        seq_l, p0_l = [int(q) for q in seqs], [int(p) for p in pos0]  # a few slots: Python, not numpy calls
        if len(seq_l) != b or len(p0_l) != b or b == 0 or b > self.n_batch or len(set(seq_l)) != b:
            return 0
        if min(seq_l) < 0 or max(seq_l) >= self.info.n_seq_max or outside(feed, self.n_vocab):
            return 0
        seq = np.asarray(seq_l, dtype=np.int32)
        p0 = np.asarray(p0_l, dtype=np.int32)
        ctx = self.tgt
        for q, p in zip(seq_l, p0_l):
            pm = ctx.pos_max(q)
            if pm >= 0 and p != pm + 1:
                return 0
        # each step continues every sequence (pos_max + 1: allowed with and without M-RoPE), so decode
        # refuses a step only for lack of cells: the context applies them in bulk where it can
        m = ctx.advance_tokens(seq_l, p0_l, feed)
        if m == 0:
            return 0
        if m < 0:
            m = 0
            for j in range(k):
                if ctx.decode(feed[j], p0 + j, seq, self.n_ubatch, self.n_vocab) != 0:
                    break
                m += 1
            if m == 0:
                return 0
        self.stats["decode"] += m
        self.stats["decode_tokens"] += m * b
        self._last = (feed[m - 1].copy(), (p0 + (m - 1)).astype(np.int32), np.ones(b, dtype=np.int8))
        return m

    def advance_steps(self, steps: Sequence[Sequence[tuple[int, Any, int]]], logits: Sequence[Sequence[int]]) -> int:
        """Up to `len(steps)` target decodes at once. A step is a batch given as its runs in row order,
        `(seq, tokens, pos0)`: `tokens` (an int32 array or a list) at positions pos0, pos0 + 1, ...
        of `seq`; at most n_batch rows a step. `logits[j]`: the rows of step j that request logits.

        Returns how many steps `m` were applied: those before the first that `decode` would refuse
        (no free cells, or an invalid batch: the caller's plain step then meets that refusal itself).
        Afterwards the memory is exactly what m `decode` calls would have left, `_last` included (the
        rows `sample` reads). A KV cache without a sliding window (alone, or a hybrid memory's attention
        part beside its recurrent part) whose sequences simply continue is advanced in bulk (free
        cells per stream decide; the cells of all m steps are appended at once; the recurrent states
        end at each sequence's last position); anything else runs the real decode step by step. A memory with a draft returns 0.
        (The simulator's prompt fast-forward, slotlab/sim/fastforward.py, calls it.)"""
        if not steps or self.dft is not None:
            return 0
        sizes = [sum(len(t) for _, t, _ in st) for st in steps]
        if min(sizes) == 0 or max(sizes) > self.n_batch:
            return 0
        ctx = self.tgt
        m = -1
        cache = ctx.caches[0]
        # a count cache alone (plain KV, a hybrid memory's attention part) refuses a step exactly when
        # a stream lacks free cells for its rows once no ubatch can exceed it; M-RoPE positions that
        # continue each sequence pass the batch checks as plain ones do
        if (ctx.plain_kv or (ctx.kind == "hybrid" and not ctx.iswa)) and cache.spec.size >= self.n_ubatch:
            m = self._bulk_steps(ctx, cache, steps)
        elif ctx.iswa and cache.spec.size >= self.n_ubatch and cache.spec.n_stream > 1:
            m = self._bulk_steps(ctx, cache, steps, win=ctx.attn[1])
        if m < 0:  # step by step
            m = 0
            for st in steps:
                if ctx.decode(*step_batch(st), self.n_ubatch, self.n_vocab) != 0:
                    break
                m += 1
        if m == 0:
            return 0
        self.stats["decode"] += m
        self.stats["decode_tokens"] += sum(sizes[:m])
        self._last = (steps[m - 1], logits[m - 1])  # made into rows if a sample reads them (last_row)
        return m

    def _known_in_vocab(self, t: np.ndarray, n_vocab: int) -> bool:
        """Whether chunk `t` is a view of a read-only int32 array whose every id is below n_vocab
        (checked once a base, the last 64 kept): a prompt fast-forward passes its prompt's chunks as
        views of the task's tokens, which the server made read-only."""
        b = t.base
        if b is None or b.flags.writeable or b.dtype != np.int32 or b.ndim != 1:
            return False
        known = self._in_vocab
        if known.get(id(b)) is b:
            return True
        if not b.size or outside(b, n_vocab):
            return False
        if len(known) >= 64:
            del known[next(iter(known))]
        known[id(b)] = b
        return True

    def step_fits(self, runs: Sequence[tuple[int, Any, int]]) -> bool:
        """True when a decode of the batch `runs` ((seq, tokens, pos0) in row order, positions that
        continue each sequence) cannot fail for lack of cells; False when that is not known here.

        Known for a stream per sequence (no `--kv-unified`): a count cache fails exactly when a stream
        lacks free cells for its rows (no ubatch exceeding it), a recurrent part never fails, and a
        window cache of at least n_swa + n_ubatch cells (its size unless --swa-full, which makes it as
        large as the full cache) always has a ubatch's cells usable, since only the sequence's own
        cells inside the window (fewer than n_swa: one a position) are not. (The fast-forward asks
        before it makes a checkpoint that must precede the decode.)"""
        ctx = self.tgt
        if self.dft is not None or not ctx.attn:
            return self.dft is None
        base = ctx.attn[0]
        if base.spec.n_stream == 1 or base.spec.size < self.n_ubatch:
            return False
        if ctx.iswa:
            win = ctx.attn[1].spec
            if win.size < win.n_swa + self.n_ubatch and win.size < base.spec.size:
                return False
        need: dict[int, int] = {}
        for q, t, _ in runs:
            st = base.stream_of(q)
            need[st] = need.get(st, 0) + len(t)
        return all(k <= base.free(st) for st, k in need.items())

    def _bulk_steps(self, ctx: PaperContext, cache: CountCache, steps, win=None) -> int:
        """`advance_steps` on a count cache (and, with `win`, the window half of an iSWA pair whose
        sequences each have a stream of their own): -1 when the steps are not plain continuations
        (then the caller decodes them one by one; nothing was changed), else the steps applied (0: the
        first does not fit).

        The count cache refuses a step exactly when a stream lacks free cells for its rows (see
        `PaperContext._unsplit`), and takes each sequence's rows in order whatever the split: its cells
        are appended once, after the last step. The window half needs the split: each step's
        ubatches (`split_equal_spans`, sequential, as `PaperContext._place` splits without
        --kv-unified) are placed as its decode would place them (`CellCache.place_alone`), after the
        step's count-cache check passed, as `_place` checks the full half first."""
        n_stream = cache.spec.n_stream
        n_seq, n_vocab = self.info.n_seq_max, self.n_vocab
        nxt: dict[int, int] = {}  # seq -> the position its next cell must have
        start: dict[int, int] = {}  # seq -> the position of its first cell in the steps
        arrays: dict[int, list] = {}  # seq -> its token arrays over the steps: their ids checked at once
        for st in steps:  # checked before anything is written: -1 must leave the memory as it was
            for q, t, p0 in st:
                if not 0 <= q < n_seq:
                    return -1
                if q not in nxt:
                    pm = ctx.pos_max(q)
                    nxt[q] = pm + 1 if pm >= 0 else p0
                    start[q] = nxt[q]
                    if cache.pos_max(q) >= nxt[q]:
                        return -1  # (a hybrid memory's pos_max is its parts' smaller one)
                    if win is not None and not win.seqs[win.stream_of(q)] <= {q}:
                        return -1  # another sequence's cells in its window stream: the real decode
                if p0 != nxt[q]:
                    return -1  # not position after position (the real decode may still take it)
                if len(t) and n_vocab > 0:
                    if isinstance(t, np.ndarray):
                        arrays.setdefault(q, []).append(t)
                    elif not (0 <= t[0] < n_vocab if len(t) == 1 else all(0 <= x < n_vocab for x in t)):
                        return -1  # (one row: a generating slot's token)
                nxt[q] = p0 + len(t)
            if win is not None and len({q for q, _, _ in st}) != len(st):
                return -1  # a sequence in two runs of one step: split_equal's general loop
        for ts in arrays.values():  # (a prompt's chunks: one check, not one a chunk)
            ts = [t for t in ts if not self._known_in_vocab(t, n_vocab)]
            if ts and outside(ts[0] if len(ts) == 1 else np.concatenate(ts), n_vocab):
                return -1
        free = [cache.free(st) for st in range(n_stream)]
        parts: dict[int, list] = {q: [] for q in nxt}  # seq -> its token runs, in order
        n_ub = self.n_ubatch
        m = 0
        for st in steps:
            need = [0] * n_stream
            for q, t, _ in st:
                need[cache.stream_of(q)] += len(t)
            if any(k > f for k, f in zip(need, free)):
                break  # prepare would fail here: the steps before it are applied
            if win is not None:
                rows, a = [], 0
                for q, t, _ in st:
                    rows.append((q, a, a + len(t)))
                    a += len(t)
                run_of = {q: (np.asarray(t, dtype=np.int32), p0, a0) for (q, t, p0), (_, a0, _) in zip(st, rows)}
                ubs = []
                for ub in split_equal_spans(rows, n_ub, sequential=True):
                    groups = []
                    for q, i, k in ub:
                        t, p0, a0 = run_of[q]
                        o = i - a0
                        e = p0 + o + k
                        groups.append((q, POSITIONS[p0 + o:e] if e <= N_POSITIONS else np.arange(p0 + o, e, dtype=np.int32),
                                       t[o:o + k]))
                    ubs.append(groups)
                if not win.place_alone(ubs):
                    break  # find_slot fails in the window half: this decode changes nothing
            for q, t, _ in st:
                if len(t):
                    parts[q].append(t)
            free = [f - k for k, f in zip(need, free)]
            m += 1
        if m == 0:
            return 0
        ends = {}
        for q, ts in parts.items():
            if not ts:
                continue
            toks = np.concatenate([np.asarray(t, dtype=np.int32) for t in ts])
            p0 = start[q]
            ends[q] = p0 + len(toks)
            cache.seq_cells(q).extend(np.arange(p0, ends[q], dtype=np.int32), toks, in_order=True)
            cache.used[cache.stream_of(q)] += len(toks)
        if ctx.recr is not None:  # the recurrent part: each sequence's state ends at its last position
            ctx.recr.commit({q: e - 1 for q, e in ends.items()})
        return m

    def decode_draft(self, batch: Batch, off: int, n: int) -> int:
        self.stats["decode_draft"] += 1
        return self._decode(self._pick(True), batch, off, n)

    def sampler(self, *, temperature: float, seed: int, ignore_eos: bool, sampling=None,
                prompt=None) -> PaperSampler:
        """Placeholder tokens: a function of (the row's token, its position, and the seed when
        temperature > 0), so equal prompts give equal continuations on any slot.

        `sampling` (a request's `SamplingParams`: top-k/p, penalties, grammar, ...) and `prompt` (the
        tokens the server's chain is fed first) are accepted as `LlamaMemory.sampler` accepts them, so
        a request that sets them runs on paper too; they are ignored: without logits there is nothing
        for the chain to shape, and a placeholder depends on the temperature and seed alone."""
        return PaperSampler(self, int(seed) & 0xFFFFFFFF if temperature > 0 else 0)

    def draft(self, seq: int, token: int, pos: int, n_max: int) -> list[int]:
        """Draft up to `n_max` tokens after `token` at `pos` on the draft context (decoding each, as
        LlamaMemory.draft does, then removing the drafted positions again). Each drafted token is the
        target's greedy placeholder with probability `draft_acceptance`."""
        dctx = self._pick(True)
        self._check_seq(seq)
        b = Batch(1)
        out: list[int] = []
        b.add(token, pos, seq, logits=True)
        if self._decode(dctx, b, 0, 1) == 0:
            prev, p = int(token), int(pos)
            while len(out) < n_max:
                t = self.gen_vocab.generated(prev, p, self.seed)
                u = mix(prev * 0x9E3779B97F4A7C15 + p * 0xC2B2AE3D27D4EB4F + self.seed + 7) / 2.0**64
                if u >= self.draft_acceptance:
                    t = self.gen_vocab.gen_lo + (t - self.gen_vocab.gen_lo + 1) % self.gen_vocab.n_generated
                out.append(t)
                if len(out) == n_max:
                    break
                prev, p = t, pos + len(out)
                b.clear()
                b.add(t, p, seq, logits=True)
                if self._decode(dctx, b, 0, 1) != 0:
                    break
        dctx.seq_rm(seq, pos, -1)
        return out

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return (f"PaperMemory({self.profile.name or self.profile.architecture}, n_ctx={self.n_ctx}, "
                f"n_ctx_seq={self.n_ctx_seq}, n_slots={self.info.n_seq_max}, kv_unified={self.kv_unified}, "
                f"swa_full={self.swa_full}, draft={self.dft is not None})")


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise TypeError("state data must be a uint8 array")
        return np.ascontiguousarray(data)
    return np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data,
                         dtype=np.uint8)


def paper_sizes(profile: ModelProfile, n_tokens: int, **kw) -> dict:
    """Sizes for one sequence of `n_tokens` tokens decoded from position 0 on a fresh PaperMemory built
    with `kw` (PaperMemory's arguments): state (full / partial), cells per cache, pos_min. A quick
    calculator for docs and what-ifs."""
    mem = PaperMemory(profile, **kw)
    b = Batch(mem.n_batch)
    p = 0
    while p < n_tokens:
        k = min(mem.n_batch, n_tokens - p)
        b.clear()
        b.add_seq(np.zeros(k, dtype=np.int32), p, 0)
        if mem.decode(b, 0, k) != 0:
            raise ValueError(f"{n_tokens} tokens do not fit this context")
        p += k
    return {"state": mem.state_size(0), "partial": mem.state_size(0, partial=True), "pos_min": mem.pos_min(0),
            "pos_max": mem.pos_max(0), "cells": [c.n_cells(0) for c in mem.tgt.caches]}
