"""Token sampling through a `llama_sampler` chain, one per slot.

temperature <= 0 is greedy. Otherwise the chain is the server's default (`common_sampler_init` with
default `common_params_sampling`): penalties, DRY, top-n-sigma, top-k 40, typical 1.0, top-p 0.95,
min-p 0.05, XTC, temperature, then `dist(seed)`. Penalties (1.0), DRY (0), top-n-sigma (-1), typical
(1.0) and XTC (p 0) are no-ops at those defaults and draw no random numbers, so they are left out:
the same seed gives the same tokens."""

from __future__ import annotations

import functools

from slotlab.llama._lib import lib
from slotlab.llama.model import Model

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed


@functools.lru_cache(maxsize=4)
def _eog_tokens(model: Model) -> tuple[int, ...]:
    return tuple(t for t in range(model.n_vocab) if lib.llama_vocab_is_eog(model.vocab, t))


class Sampler:
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
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = lib.llama_sampler_chain_init(params)
        if ignore_eos:
            # the server's logit_bias_eog: every end-of-generation token at -inf
            eog = _eog_tokens(model)
            arr = (lib.llama_logit_bias * len(eog))(*[lib.llama_logit_bias(t, float("-inf")) for t in eog])
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_logit_bias(model.n_vocab, len(eog), arr))
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
