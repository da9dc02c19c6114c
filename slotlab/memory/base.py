"""The memory interface: the few operations the server's decisions need from a context.

llama-server's scheduler talks to llama.cpp through a handful of calls (`common_memory::seq_rm`,
`seq_add`, `seq_pos_min` / `seq_pos_max`, `llama_state_seq_*_ext` with NONE or PARTIAL_ONLY flags,
`llama_decode`, the sampler). Everything above this module — the decision core in
`slotlab.engine` — is written against `Memory` only, so the same decisions run on:

* `LlamaMemory` (slotlab.memory.llama_memory): the real `llama_context` (and the draft one with
  `-md`), the lab and `slotlab serve`;
* `FakeMemory` (slotlab.memory.fake): token lists and computed sizes, for fast decision-core tests;
* a paper memory (the simulator): sizes from a GGUF header, no weights.

A memory holds one sequence per slot. Every sequence operation acts on the target *and* the draft
context, as the server's `common_memory` does, so the core never has to mirror them itself."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from slotlab.batch import Batch
from slotlab.errors import SlotlabError
from slotlab.sampling import SamplingParams

# `common_context_seq_rm_type` (CH:1007-1012; probed by CC:1491) as plain strings: how far back a sequence can be truncated.
SEQ_RM_NO, SEQ_RM_PART, SEQ_RM_FULL, SEQ_RM_RS = "NO", "PART", "FULL", "RS"


@dataclass(frozen=True)
class MemoryInfo:
    """What the decisions read about a memory: fixed once the context exists."""

    n_ctx: int  # llama_n_ctx: the whole context (the RAM cache's token limit)
    n_seq_max: int  # one sequence per slot
    n_ctx_slot: int  # each slot's n_ctx as the server computes it (spec 6.4)
    n_batch: int
    n_ubatch: int
    n_swa: int  # 0 with --swa-full (SC:1185)
    kv_unified: bool
    can_shift: bool  # llama_memory_can_shift: --cache-reuse needs it
    seq_rm_type: str | None  # SEQ_RM_* from the server's probe
    has_draft: bool = False  # a draft context mirrors every sequence op (-md)
    n_vocab: int = 0

    @property
    def needs_checkpoints(self) -> bool:
        """The memory-type part of the checkpoint gate (spec 4.2): a memory that cannot be cut
        back freely (recurrent / hybrid, or SWA without --swa-full) needs context checkpoints."""
        return self.seq_rm_type in (SEQ_RM_FULL, SEQ_RM_RS) or self.n_swa > 0



class SlotSampler(Protocol):
    """A slot's sampler: the token for batch row `i` of the last decode (accepted), and release.
    `last_probs`: the probabilities of the last sampled token when the request asked for `n_probs`
    (`populate_token_probs`), None where the memory reports none."""

    last_probs: Any

    def sample(self, i: int) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class Vocab(Protocol):
    """What the core needs of a tokenizer: prompts, message delimiters, stop words, end of generation."""

    n_vocab: int

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray: ...

    def detokenize(self, tokens) -> str: ...

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def check_tokens(self, tokens) -> None: ...


@runtime_checkable
class Memory(Protocol):
    """One sequence per slot over a KV memory (target, plus the draft mirror when `info.has_draft`).

    Return conventions follow llama.cpp, so the core keeps the server's tests on them: `seq_rm`
    False = refused; `decode` 0 = ok, 1 = no free KV cells (retry smaller / after a purge), -1 =
    invalid batch, < -1 = fatal; `state_set` returns the bytes read (anything but the blob's length
    is a failure, and the sequence is then empty)."""

    info: MemoryInfo
    vocab: Vocab

    # sequence operations (common_memory), on target and draft
    def seq_rm(self, seq: int, p0: int, p1: int) -> bool: ...

    def seq_rm_draft(self, seq: int, p0: int, p1: int) -> bool: ...  # the draft context alone

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None: ...

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    def seq_keep(self, seq: int) -> None: ...

    def pos_min(self, seq: int) -> int: ...

    def pos_max(self, seq: int) -> int: ...

    # state blobs: `draft` picks the draft context; `partial` = PARTIAL_ONLY (a checkpoint's data)
    def state_size(self, seq: int, *, draft: bool = False, partial: bool = False) -> int: ...

    def state_get(self, seq: int, *, draft: bool = False, partial: bool = False, out: Any = None) -> Any: ...

    def state_set(self, data: Any, seq: int, *, draft: bool = False, partial: bool = False) -> int: ...

    # slot files (llama_state_seq_save_file / load_file) on the target context
    def save_file(self, path, seq: int, tokens: np.ndarray) -> int: ...

    def load_file(self, path, seq: int) -> tuple[int, np.ndarray]: ...

    # decoding and sampling
    def decode(self, batch: Batch, off: int, n: int) -> int: ...

    def decode_draft(self, batch: Batch, off: int, n: int) -> int: ...

    def sampler(self, *, temperature: float, seed: int, ignore_eos: bool, sampling: SamplingParams | None = None,
                prompt: np.ndarray | None = None) -> SlotSampler:
        """A slot's sampler for one task. `sampling`: the request's sampler settings (None = the plain
        chain); `prompt`: its tokens, fed to the chain as `init_sampler` does. A setting the chain
        cannot take (a grammar that does not parse) raises ValueError (`common_sampler_init`)."""
        ...

    def draft(self, seq: int, token: int, pos: int, n_max: int) -> list[int]: ...

    def close(self) -> None: ...


def check_memory(mem: Any) -> None:
    """Refuse an object that does not implement the interface, naming what is missing (a quick check
    of names, made by every core; `protocol_mismatches` compares the signatures too)."""
    missing = [n for n in ("info", "vocab", "seq_rm", "seq_add", "pos_min", "pos_max", "state_size", "state_get",
                           "state_set", "decode", "sampler") if not hasattr(mem, n)]
    if missing:
        raise TypeError(f"{type(mem).__name__} is not a slotlab Memory: missing {', '.join(missing)}")


def _params(fn) -> dict[str, inspect.Parameter]:
    return {k: p for k, p in inspect.signature(fn).parameters.items() if k != "self"}


def protocol_mismatches(cls: type, protocol: type = None) -> list[str]:
    """How `cls` differs from `protocol` (default `Memory`): each method of the protocol must exist and
    take every parameter of the protocol's method, by the same name and kind (keyword-only stays
    keyword-only), with a default where the protocol has one; extra parameters need a default. Empty
    when `cls` conforms. Attributes (`info`, `vocab`) are set per instance and are not checked here."""
    protocol = protocol or Memory
    out = []
    for name, want_fn in vars(protocol).items():
        if name.startswith("_") or not callable(want_fn):
            continue
        got_fn = getattr(cls, name, None)
        if got_fn is None or not callable(got_fn):
            out.append(f"{cls.__name__}.{name} is missing")
            continue
        want, got = _params(want_fn), _params(got_fn)
        var_kw = any(p.kind is p.VAR_KEYWORD for p in got.values())
        for k, w in want.items():
            g = got.get(k)
            if g is None:
                if not (var_kw and w.kind is w.KEYWORD_ONLY):
                    out.append(f"{cls.__name__}.{name} does not take `{k}`")
                continue
            if g.kind is not w.kind and not (g.kind is g.POSITIONAL_OR_KEYWORD and w.kind is w.KEYWORD_ONLY):
                out.append(f"{cls.__name__}.{name}: `{k}` is {g.kind.description}, the protocol's is "
                           f"{w.kind.description}")
            if w.default is not w.empty and g.default is g.empty:
                out.append(f"{cls.__name__}.{name}: `{k}` needs a default (the protocol's is {w.default!r})")
        for k, g in got.items():
            if k not in want and g.default is g.empty and g.kind not in (g.VAR_POSITIONAL, g.VAR_KEYWORD):
                out.append(f"{cls.__name__}.{name}: `{k}` is not in the protocol and has no default")
    return out


__all__: Sequence[str] = ["Batch", "Memory", "MemoryInfo", "SlotSampler", "Vocab", "check_memory", "require_seq_rm",
                          "protocol_mismatches",
                          "SeqRmRefused",
                          "SEQ_RM_NO", "SEQ_RM_PART", "SEQ_RM_FULL", "SEQ_RM_RS"]


class SeqRmRefused(SlotlabError):
    """`common_memory::seq_rm` returned false where the server aborts (GGML_ABORT)."""


def require_seq_rm(memory: "Memory", seq: int, p0: int, p1: int) -> None:
    """`seq_rm` where the server cannot go on without it: a refusal aborts llama-server; here it is
    an error that names the call, never silent."""
    if not memory.seq_rm(seq, p0, p1):
        raise SeqRmRefused(f"failed to remove sequence {seq} with p0={p0}, p1={p1}")
