"""From llama-server flags to a live model and context, resolved the way the server resolves them."""

from __future__ import annotations

from dataclasses import dataclass, field

from slotlab.engine.params import ServerParams
from slotlab.errors import ConfigError
from slotlab.llama import Context, Model


@dataclass
class Backend:
    params: ServerParams
    model: Model
    ctx: Context
    dmodel: Model | None = None  # the draft model (-md), possibly the same Model object
    dctx: Context | None = None  # its context: same slots, same layout; every sequence op is mirrored
    _memory: object = field(default=None, repr=False)

    @property
    def n_ctx_slot(self) -> int:
        return self.ctx.n_ctx_slot(self.params.kv_unified_per_slot)

    def memory(self):
        """This context (and the draft one) behind the memory interface the core runs on. One per
        backend: it keeps the draft samplers and the batch views."""
        if self._memory is None:
            from slotlab.memory.llama_memory import LlamaMemory

            self._memory = LlamaMemory(self.model, self.ctx, n_ctx_slot=self.n_ctx_slot, dmodel=self.dmodel,
                                       dctx=self.dctx)
        return self._memory

    @property
    def needs_checkpoints(self) -> bool:
        """The memory-type part of the checkpoint gate (spec 4.2 step 3): one rule, MemoryInfo's."""
        return self.memory().info.needs_checkpoints

    def checkpoint_size_probe(self) -> int:
        """Bytes of one context checkpoint (a PARTIAL_ONLY state) of a one-token sequence: for a
        recurrent or hybrid model that is the recurrent state the server snapshots, for SWA the window
        part. Decodes one token on slot 0 of an idle context and clears it again."""
        from slotlab.llama import STATE_SEQ_FLAGS_PARTIAL_ONLY, Batch

        b = Batch(1)
        b.add(0, 0, 0, logits=False)
        try:
            if self.ctx.decode(b) != 0:
                return -1
            return self.ctx.state_seq_size(0, STATE_SEQ_FLAGS_PARTIAL_ONLY)
        finally:
            self.ctx.seq_rm(0, -1, -1)

    def describe(self) -> dict:
        """Everything `slotlab info` prints, as plain data."""
        from importlib.metadata import version

        from slotlab import __version__
        from slotlab.llama import supports_gpu_offload
        from slotlab.llama.build import LLAMA_CPP_BUILD, LLAMA_CPP_COMMIT

        p, m, c = self.params, self.model, self.ctx
        return {
            "slotlab": __version__,
            "llama_cpp_python": version("llama-cpp-python"),
            "llama_cpp_build": LLAMA_CPP_BUILD, "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "model": {"path": str(m.path), "desc": m.desc, "architecture": m.architecture,
                      "n_params": m.n_params, "size_bytes": m.size_bytes, "n_ctx_train": m.n_ctx_train,
                      "n_swa": m.n_swa, "n_layer": m.n_layer, "n_vocab": m.n_vocab, "add_bos": m.add_bos,
                      "n_gpu_layers": m.n_gpu_layers, "no_repack": not m.use_extra_bufts},
            "build": {"gpu_offload": supports_gpu_offload()},
            "context": {"n_ctx": c.n_ctx, "n_ctx_seq": c.n_ctx_seq, "n_batch": c.n_batch, "n_ubatch": c.n_ubatch,
                        "n_threads": c.n_threads, "n_threads_batch": c.n_threads_batch},
            "slots": {"n_slots": c.n_seq_max, "auto": p.n_parallel == -1, "kv_unified": c.kv_unified,
                      "n_ctx_slot": self.n_ctx_slot, "kv_unified_per_slot": p.kv_unified_per_slot},
            "memory": {"swa_full": c.swa_full, "n_swa": c.n_swa, "can_shift": c.can_shift,
                       "seq_rm_type": c.seq_rm_type.value if c.seq_rm_type else None,
                       "needs_checkpoints": self.needs_checkpoints,
                       "checkpoint_bytes_1": self.checkpoint_size_probe()},
            "cache": {"cache_ram_mib": p.cache_ram, "slot_prompt_similarity": p.slot_prompt_similarity,
                      "cache_idle_slots": p.cache_idle_slots_effective, "cache_reuse": p.cache_reuse,
                      "ctx_checkpoints": p.ctx_checkpoints, "checkpoint_min_step": p.checkpoint_min_step,
                      "slot_save_path": p.slot_save_path},
        }

    def close(self) -> None:
        if self.dctx is not None:
            self.dctx.close()
        if self.dmodel is not None and self.dmodel is not self.model:
            self.dmodel.close()
        self.ctx.close()
        self.model.close()


def load(params: ServerParams | None = None, model: Model | None = None) -> Backend:
    """Load the model (unless given) and create the context for `params`."""
    params = params or ServerParams()
    model = model or Model(params.model, n_gpu_layers=params.n_gpu_layers, use_extra_bufts=not params.no_repack)
    n_draft = params.draft_max if params.speculative else 0
    kw = dict(n_ctx=params.n_ctx_requested, n_parallel=params.n_slots, kv_unified=params.kv_unified_effective,
              swa_full=params.swa_full, n_batch=params.n_batch, n_ubatch=params.n_ubatch, n_threads=params.n_threads,
              n_threads_batch=params.n_threads_batch, n_draft=n_draft, type_k=params.cache_type_k,
              type_v=params.cache_type_v, flash_attn=params.flash_attn)
    ctx = Context(model, **kw)
    if params.warmup:
        ctx.warmup()
    dmodel = dctx = None
    if params.speculative:
        from pathlib import Path

        same = Path(params.model_draft).resolve() == Path(model.path).resolve()
        dmodel = model if same else Model(params.model_draft, n_gpu_layers=params.n_gpu_layers,
                                          use_extra_bufts=not params.no_repack)
        if dmodel.n_vocab != model.n_vocab:
            raise ConfigError(f"-md {params.model_draft}: the draft vocabulary ({dmodel.n_vocab} tokens) does not "
                              f"match the target's ({model.n_vocab}): draft model vocab type must match target model")
        dctx = Context(dmodel, **kw)
        if params.warmup:  # the draft is loaded by common_init_from_params too (warm-up included)
            dctx.warmup()
    return Backend(params, model, ctx, dmodel, dctx)
