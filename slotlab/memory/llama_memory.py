"""The memory interface over a real `llama_context` (and the draft context of `-md`).

Every sequence operation is mirrored on the draft context, as the server's `common_memory` does; a
refused `seq_rm` is reported, never ignored. The core's planned batch is handed to llama.cpp through
a `slotlab.llama.Batch` that shares its numpy buffers (no copy per decode)."""

from __future__ import annotations

from typing import Any

import numpy as np

from slotlab.llama import STATE_SEQ_FLAGS_NONE, STATE_SEQ_FLAGS_PARTIAL_ONLY, Batch as LlamaBatch, Context, Model, Sampler
from slotlab.llama.sampling import ServerSampler
from slotlab.memory.base import Batch, MemoryInfo
from slotlab.sampling import SamplingParams


def _flags(partial: bool) -> int:
    return STATE_SEQ_FLAGS_PARTIAL_ONLY if partial else STATE_SEQ_FLAGS_NONE


class _Sampler:
    """A llama sampler chain bound to the context whose logits it reads. `last_probs`: the
    `TokenProbs` of the last sampled token when the request asked for `n_probs`, else None."""

    def __init__(self, sampler: Sampler | ServerSampler, ctx: Context):
        self._s, self._ctx = sampler, ctx
        self._server = isinstance(sampler, ServerSampler)

    def sample(self, i: int) -> int:
        tok = self._s.sample(self._ctx, i)
        if self._server:  # common_sampler_accept after common_sampler_sample (the plain path accepted)
            self._s.accept(tok)
        return tok

    @property
    def last_probs(self):
        return self._s.last_probs

    def close(self) -> None:
        self._s.close()


class LlamaMemory:
    """`Memory` on a live context: `model`/`ctx` the target, `dmodel`/`dctx` the optional draft."""

    def __init__(self, model: Model, ctx: Context, *, n_ctx_slot: int, dmodel: Model | None = None,
                 dctx: Context | None = None):
        self.model, self.ctx, self.dmodel, self.dctx = model, ctx, dmodel, dctx
        self.vocab = model
        self.info = MemoryInfo(
            n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max, n_ctx_slot=n_ctx_slot, n_batch=ctx.n_batch,
            n_ubatch=ctx.n_ubatch, n_swa=ctx.n_swa, kv_unified=ctx.kv_unified, can_shift=ctx.can_shift,
            seq_rm_type=ctx.seq_rm_type.value if ctx.seq_rm_type is not None else None,
            has_draft=dctx is not None, n_vocab=model.n_vocab)
        self._views: dict[int, LlamaBatch] = {}
        self._draft_batch = LlamaBatch(1)
        self._draft_samplers: dict[int, Sampler] = {}

    def _ctxs(self):
        return (self.ctx,) if self.dctx is None else (self.ctx, self.dctx)

    # -- sequence operations ----------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return all([c.seq_rm(seq, p0, p1) for c in self._ctxs()])

    def seq_rm_draft(self, seq: int, p0: int, p1: int) -> bool:
        return self._pick(True).seq_rm(seq, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for c in self._ctxs():
            c.seq_add(seq, p0, p1, delta)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        for c in self._ctxs():
            c.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        for c in self._ctxs():
            c.seq_keep(seq)

    def pos_min(self, seq: int) -> int:
        return self.ctx.seq_pos_min(seq)

    def pos_max(self, seq: int) -> int:
        return self.ctx.seq_pos_max(seq)

    # -- state blobs ------------------------------------------------------------------------------

    def _pick(self, draft: bool) -> Context:
        if draft and self.dctx is None:
            raise ValueError("no draft context (-md) in this memory")
        return self.dctx if draft else self.ctx

    def state_size(self, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        return self._pick(draft).state_seq_size(seq, _flags(partial))

    def state_get(self, seq: int, *, draft: bool = False, partial: bool = False, out: Any = None) -> np.ndarray:
        return self._pick(draft).state_seq_get(seq, _flags(partial), out=out)

    def state_set(self, data: Any, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        return self._pick(draft).state_seq_set(data, seq, _flags(partial))

    def save_file(self, path, seq: int, tokens: np.ndarray) -> int:
        return self.ctx.state_seq_save_file(path, seq, tokens)

    def load_file(self, path, seq: int) -> tuple[int, np.ndarray]:
        return self.ctx.state_seq_load_file(path, seq)

    # -- decoding ---------------------------------------------------------------------------------

    def _view(self, batch: Batch) -> LlamaBatch:
        lb = self._views.get(id(batch))
        if lb is None or lb.token is not batch.token:
            lb = self._views[id(batch)] = LlamaBatch(batch.capacity, arrays=batch)
        lb.n_tokens = batch.n_tokens
        return lb

    def decode(self, batch: Batch, off: int, n: int) -> int:
        return self.ctx.decode(self._view(batch), off, n)

    def decode_draft(self, batch: Batch, off: int, n: int) -> int:
        return self._pick(True).decode(self._view(batch), off, n)

    def sampler(self, *, temperature: float, seed: int, ignore_eos: bool, sampling: SamplingParams | None = None,
                prompt=None) -> _Sampler:
        """With `sampling` (a request that set the server's sampling fields) the server's chain
        (raises `SamplerInitError` as `common_sampler_init` throws), which is fed `prompt` as
        `init_sampler` does; without, the plain chain the golden traces were recorded with."""
        if sampling is None:
            return _Sampler(Sampler(self.model, temperature=temperature, seed=seed, ignore_eos=ignore_eos), self.ctx)
        s = ServerSampler(self.model, sampling)
        if prompt is not None:
            s.accept_prompt(prompt)
        return _Sampler(s, self.ctx)

    def draft(self, seq: int, token: int, pos: int, n_max: int) -> list[int]:
        """Greedy draft of up to `n_max` tokens after `token` at `pos` on the draft context; the
        drafted positions are removed from the draft KV again (the verify batch decodes them)."""
        dctx, b = self._pick(True), self._draft_batch
        smpl = self._draft_samplers.get(seq)
        if smpl is None:
            smpl = self._draft_samplers[seq] = Sampler(self.dmodel)
        out: list[int] = []
        b.clear()
        b.add(token, pos, seq, logits=True)
        if dctx.decode(b) == 0:
            while len(out) < n_max:
                t = smpl.sample(dctx, 0)
                out.append(t)
                if len(out) == n_max:
                    break
                b.clear()
                b.add(t, pos + len(out), seq, logits=True)
                if dctx.decode(b) != 0:
                    break
        dctx.seq_rm(seq, pos, -1)
        return out

    def close(self) -> None:
        for s in self._draft_samplers.values():
            s.close()
        self._draft_samplers.clear()
