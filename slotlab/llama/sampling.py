"""Token sampling through a `llama_sampler` chain, one per slot.

Two paths:

* the plain one (no `SamplingParams`, the lab's and the engine's default requests): temperature <= 0
  is greedy; otherwise the server's default chain less its no-op samplers (penalties 1.0, DRY 0,
  top-n-sigma -1, typical 1.0, XTC p 0 draw no random numbers and change nothing, so the same seed
  gives the same tokens). `llama_sampler_sample` does all of it in C.
* the server's (`ServerSampler`, given a `slotlab.sampling.SamplingParams`): the chain
  `common_sampler_init` builds (logit bias + the vocabulary's suppress tokens, the `samplers` order
  of penalties / DRY / top-n-sigma / top-k / typical / top-p / min-p / XTC / temperature, then dist
  or adaptive-p, or mirostat), the grammar sampler kept beside the chain, and `common_sampler_sample`'s
  grammar rejection sampling, over a candidate array slotlab owns, so the candidates are there to
  report (`n_probs`, `post_sampling_probs`) as `populate_token_probs` does."""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np

from slotlab.llama._lib import lib
from slotlab.llama.model import Model
from slotlab.sampling import DEFAULT_SEED, SamplingParams

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(lib.llama_token_data)


@functools.lru_cache(maxsize=4)
def _eog_tokens(model: Model) -> tuple[int, ...]:
    return tuple(t for t in range(model.n_vocab) if lib.llama_vocab_is_eog(model.vocab, t))


@functools.lru_cache(maxsize=4)
def _suppress_tokens(model: Model) -> tuple[int, ...]:
    n = ctypes.c_int32(0)
    ptr = lib.llama_vocab_get_suppress_tokens(model.vocab, ctypes.byref(n))
    return tuple(int(ptr[i]) for i in range(n.value)) if ptr and n.value > 0 else ()


def _logit_bias_sampler(n_vocab: int, biases: list[tuple[int, float]]):
    arr = (lib.llama_logit_bias * len(biases))(*[lib.llama_logit_bias(int(t), float(b)) for t, b in biases])
    return lib.llama_sampler_init_logit_bias(n_vocab, len(biases), arr)


class Sampler:
    """The plain path (see the module doc)."""

    def __init__(
        self,
        model: Model,
        *,
        temperature: float = 0.0,
        seed: int = DEFAULT_SEED,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        ignore_eos: bool = False,
    ):
        self.model = model
        self.temperature, self.seed, self.ignore_eos = float(temperature), int(seed) & 0xFFFFFFFF, ignore_eos
        self.last_probs = None  # the plain path reports none
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = lib.llama_sampler_chain_init(params)
        if ignore_eos:
            # the server's logit_bias_eog: every end-of-generation token at -inf
            eog = _eog_tokens(model)
            lib.llama_sampler_chain_add(chain, _logit_bias_sampler(model.n_vocab, [(t, float("-inf")) for t in eog]))
        if self.temperature <= 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(top_k))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(top_p, 0))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_min_p(min_p, 0))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp_ext(self.temperature, 0.0, 1.0))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(self.seed))
        self._ptr = chain

    def sample(self, ctx, idx: int) -> int:
        """Sample from the logits of batch output `idx` of `ctx` and accept the token."""
        return int(lib.llama_sampler_sample(self._ptr, ctx.ptr, idx))

    def accept(self, token: int) -> None:
        lib.llama_sampler_accept(self._ptr, int(token))

    def reset(self) -> None:
        lib.llama_sampler_reset(self._ptr)

    def close(self) -> None:
        if getattr(self, "_ptr", None):
            lib.llama_sampler_free(self._ptr)
            self._ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


@dataclass
class TokenProbs:
    """`completion_token_output` of one sampled token: its probability and the top candidates
    (id, probability), pre-sampling (softmax of the raw logits) or post-sampling (the chain's)."""

    token: int
    prob: float
    top: list[tuple[int, float]]
    post_sampling: bool


class SamplerInitError(ValueError):
    """`common_sampler_init` threw: the server answers `Failed to initialize samplers: ...` (400)."""


class ServerSampler:
    """The server's sampler (`common_sampler`): the chain, the grammar beside it, and the candidate
    array of the last sample. `sample` does not accept; `accept(token)` does (both the grammar and
    the chain, as `common_sampler_accept(.., is_generated=true)`); `accept_prompt` feeds prompt
    tokens to the chain alone (`init_sampler`)."""

    def __init__(self, model: Model, params: SamplingParams):
        p = params
        if not math.isfinite(p.penalty_repeat) or p.penalty_repeat <= 0 or not math.isfinite(1.0 / p.penalty_repeat):
            raise SamplerInitError("penalty_repeat must be finite and greater than 0")
        if not math.isfinite(p.penalty_freq):
            raise SamplerInitError("penalty_freq must be finite")
        if not math.isfinite(p.penalty_present):
            raise SamplerInitError("penalty_present must be finite")
        self.model, self.params = model, p
        self.n_vocab = model.n_vocab
        self.seed = int(p.seed) & 0xFFFFFFFF
        self.last_probs: TokenProbs | None = None
        self._grmr = None
        self._chain = None
        self._keep: list = []  # ctypes buffers the samplers were built from
        if p.grammar:
            self._grmr = lib.llama_sampler_init_grammar(model.vocab, p.grammar.encode(), b"root")
            if not self._grmr:
                raise SamplerInitError("failed to parse grammar")
        cparams = lib.llama_sampler_chain_default_params()
        cparams.no_perf = True
        self._chain = lib.llama_sampler_chain_init(cparams)
        for s in self._build(p):
            lib.llama_sampler_chain_add(self._chain, s)
        self._ids = np.arange(self.n_vocab, dtype=np.int32)
        self._cur = np.empty(self.n_vocab, dtype=_TOKEN_DATA)
        self._arr = lib.llama_token_data_array()
        self._cand: np.ndarray | None = None  # cur_p after the last sample (a view into _cur)
        self._selected = -1

    def _build(self, p: SamplingParams) -> list:
        vocab, n_vocab = self.model.vocab, self.n_vocab
        out = []
        merged = [(int(t), float(b)) for t, b in p.logit_bias]
        if p.ignore_eos:
            merged += [(t, float("-inf")) for t in _eog_tokens(self.model)]
        merged += [(t, float("-inf")) for t in _suppress_tokens(self.model)]
        if merged:
            out.append(_logit_bias_sampler(n_vocab, merged))
        seed = self.seed
        if p.mirostat == 0:
            adaptive = False
            for name in p.samplers:
                if name == "dry":
                    brk = [s.encode() for s in p.dry_sequence_breakers]
                    c_brk = (ctypes.c_char_p * len(brk))(*brk)
                    self._keep.append((brk, c_brk))
                    out.append(lib.llama_sampler_init_dry(vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                                          p.dry_penalty_last_n, c_brk, len(brk)))
                elif name == "top_k":
                    out.append(lib.llama_sampler_init_top_k(p.top_k))
                elif name == "top_p":
                    out.append(lib.llama_sampler_init_top_p(p.top_p, p.min_keep))
                elif name == "top_n_sigma":
                    out.append(lib.llama_sampler_init_top_n_sigma(p.top_n_sigma))
                elif name == "min_p":
                    out.append(lib.llama_sampler_init_min_p(p.min_p, p.min_keep))
                elif name == "xtc":
                    out.append(lib.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, p.min_keep, seed))
                elif name == "typ_p":
                    out.append(lib.llama_sampler_init_typical(p.typ_p, p.min_keep))
                elif name == "temperature":
                    out.append(lib.llama_sampler_init_temp_ext(p.temp, p.dynatemp_range, p.dynatemp_exponent))
                elif name == "infill":
                    out.append(lib.llama_sampler_init_infill(vocab))
                elif name == "penalties":
                    out.append(lib.llama_sampler_init_penalties(n_vocab, p.penalty_last_n, p.penalty_repeat,
                                                                p.penalty_freq, p.penalty_present))
                elif name == "adaptive_p":
                    adaptive = True
                else:
                    raise SamplerInitError(f"unknown sampler type {name!r}")
            if adaptive:
                out.append(lib.llama_sampler_init_adaptive_p(p.adaptive_target, p.adaptive_decay, seed))
            else:
                out.append(lib.llama_sampler_init_dist(seed))
        elif p.mirostat == 1:
            out.append(lib.llama_sampler_init_temp(p.temp))
            out.append(lib.llama_sampler_init_mirostat(n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100))
        elif p.mirostat == 2:
            out.append(lib.llama_sampler_init_temp(p.temp))
            out.append(lib.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
        else:
            raise SamplerInitError(f"unknown mirostat version {p.mirostat}")
        return out

    # -- sampling ---------------------------------------------------------------------------------

    def _set_logits(self, logits: np.ndarray) -> None:
        cur = self._cur
        cur["id"] = self._ids
        cur["logit"] = logits
        cur["p"] = 0.0
        a = self._arr
        a.data = cur.ctypes.data_as(ctypes.POINTER(lib.llama_token_data))
        a.size, a.selected, a.sorted = self.n_vocab, -1, False

    def _apply(self, smpl) -> None:
        lib.llama_sampler_apply(smpl, ctypes.byref(self._arr))

    def _grammar_allows(self, token: int) -> bool:
        one = np.array([(token, 1.0, 0.0)], dtype=_TOKEN_DATA)
        arr = lib.llama_token_data_array(one.ctypes.data_as(ctypes.POINTER(lib.llama_token_data)), 1, -1, False)
        lib.llama_sampler_apply(self._grmr, ctypes.byref(arr))
        return bool(one["logit"][0] != -np.inf)

    def sample(self, ctx, idx: int) -> int:
        """`common_sampler_sample(.., grammar_first=false)`: the chain, then the grammar check of its
        pick, and on a rejection the grammar first and the chain again. Does not accept."""
        lib.llama_synchronize(ctx.ptr)
        logits = ctx.logits(idx)
        self._set_logits(logits)
        self._apply(self._chain)
        tok = self._selected_token()
        if self._grmr is not None and not self._grammar_allows(tok):
            self._set_logits(logits)
            self._apply(self._grmr)
            self._apply(self._chain)
            if self._arr.selected < 0:
                raise RuntimeError("no selected token during sampling - check your sampling configuration")
            tok = self._selected_token()
        if self.params.n_probs > 0:
            self.last_probs = self._probs(tok, logits)
        return tok

    def _selected_token(self) -> int:
        a = self._arr
        base = ctypes.addressof(a.data.contents)
        off = (base - self._cur.ctypes.data) // _TOKEN_DATA.itemsize
        self._cand = self._cur[off:off + a.size]
        self._selected = int(a.selected)
        return int(self._cand["id"][a.selected])

    def _probs(self, tok: int, logits: np.ndarray) -> TokenProbs:
        """`populate_token_probs`."""
        n_req = int(self.params.n_probs)
        if self.params.post_sampling_probs:
            cand = self._cand
            order = np.argsort(-cand["p"], kind="stable")  # common_sampler_get_candidates(.., sorted)
            ids, ps = cand["id"][order], cand["p"][order]
            hit = np.nonzero(ids == tok)[0]
            prob = float(ps[hit[0]]) if hit.size else 1.0
            top = []
            for i in range(min(len(ids), n_req)):
                if ps[i] == 0.0:  # the server drops zero probabilities
                    break
                top.append((int(ids[i]), float(ps[i])))
            return TokenProbs(tok, prob, top, True)
        # get_token_probabilities: softmax over the raw logits, the top n by logit
        lg = np.asarray(logits, dtype=np.float32)
        n = min(n_req, lg.shape[0])
        part = np.argpartition(-lg, n - 1)[:n] if n < lg.shape[0] else np.arange(lg.shape[0])
        top_ids = part[np.argsort(-lg[part], kind="stable")]
        max_l = lg[top_ids[0]]
        e = np.exp(lg - max_l, dtype=np.float32)
        # the server sums the float32 exps one by one in descending logit order (numpy's pairwise
        # sum is more exact, and so 2e-4 off the server's logprobs on a 262k vocabulary)
        s = np.cumsum(e[np.argsort(-lg, kind="stable")], dtype=np.float32)[-1]
        probs = e / s
        return TokenProbs(tok, float(probs[tok]), [(int(t), float(probs[t])) for t in top_ids], False)

    def accept(self, token: int) -> None:
        if self._grmr is not None:
            lib.llama_sampler_accept(self._grmr, int(token))
        lib.llama_sampler_accept(self._chain, int(token))

    def accept_prompt(self, tokens) -> None:
        """`init_sampler`: reset the chain (the grammar keeps its state) and feed it the prompt."""
        lib.llama_sampler_reset(self._chain)
        for t in np.asarray(tokens, dtype=np.int64).tolist():
            lib.llama_sampler_accept(self._chain, int(t))

    def close(self) -> None:
        if getattr(self, "_chain", None):
            lib.llama_sampler_free(self._chain)
            self._chain = None
        if getattr(self, "_grmr", None):
            lib.llama_sampler_free(self._grmr)
            self._grmr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
