"""How long a server step takes: a linear cost per micro-batch, `t(n) = t_fixed + n * t_token`.

`t_fixed` is what one decode costs whatever its size (reading the weights once: the memory-bound
part, so single-sequence generation runs at about 1 / (t_fixed + t_token) tokens/s); `t_token` what
each token adds (the compute-bound part: long prefills approach 1 / t_token tokens/s). A decode of n
tokens runs as ceil(n / n_ubatch) micro-batches. Generation with B sequences is one decode of B
tokens: B / (t_fixed + B t_token) tokens/s in total, which is what makes batching pay.

Not modelled: attention cost growing with the context, KV reads, prompt-cache copies (state saves /
loads to RAM are taken as free), sampling. `SpeedModel.from_rates(prefill_tps, gen_tps)` builds one
from the two numbers a GPU's spec sheet or a benchmark gives; `calibrate()` measures the real model
on this machine (slotlab calibrate)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SpeedModel", "calibrate"]


@dataclass(frozen=True)
class SpeedModel:
    t_fixed: float  # seconds per micro-batch
    t_token: float  # seconds per token
    n_ubatch: int = 512
    source: str = ""

    @classmethod
    def from_rates(cls, prefill_tps: float, gen_tps: float, n_ubatch: int = 512, source: str = "") -> "SpeedModel":
        """`prefill_tps`: prompt tokens/s of a long prefill; `gen_tps`: tokens/s of one sequence generating."""
        if prefill_tps <= 0 or gen_tps <= 0:
            raise ValueError("prefill and generation rates must be > 0")
        # a full micro-batch prefills at prefill_tps, one token decodes at gen_tps
        t_token = max(1e-12, (n_ubatch / prefill_tps - 1.0 / gen_tps) / max(1, n_ubatch - 1))
        t_fixed = max(0.0, 1.0 / gen_tps - t_token)
        return cls(t_fixed, t_token, n_ubatch, source or f"prefill {prefill_tps:g} tok/s, generation {gen_tps:g} tok/s")

    def decode_time(self, n_tokens: int) -> float:
        if n_tokens <= 0:
            return 0.0
        k = -(-n_tokens // self.n_ubatch)
        return k * self.t_fixed + n_tokens * self.t_token

    def gen_rate(self, batch: int = 1) -> float:
        """Tokens/s per sequence when `batch` sequences generate together."""
        return 1.0 / self.decode_time(batch)

    def prefill_rate(self, n: int = 2048) -> float:
        return n / self.decode_time(n)

    def to_json(self, path=None) -> str:
        text = json.dumps(asdict(self), indent=1)
        if path:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, src) -> "SpeedModel":
        s = str(src)
        d = json.loads(s if s.lstrip().startswith("{") else Path(src).read_text())
        return cls(**d)


def calibrate(model_path=None, *, sizes=(1, 2, 4, 8, 32, 128, 512), repeats: int = 3, n_threads: int | None = None,
              n_gpu_layers: int = 0) -> tuple[SpeedModel, list[tuple[int, float]]]:
    """Time real decodes of `sizes` tokens on the model (after a warm-up) and fit t(n) = t_fixed +
    n t_token by least squares over single-micro-batch sizes. Returns the model and the (n, seconds)
    medians measured."""
    import numpy as np

    from slotlab.llama import Batch, Context, Model

    m = Model(model_path, n_gpu_layers=n_gpu_layers)
    n_ub = max(sizes)
    kw = dict(n_ctx=4096, n_batch=n_ub, n_ubatch=n_ub)
    if n_threads:
        kw.update(n_threads=n_threads, n_threads_batch=n_threads)
    ctx = Context(m, **kw)
    pts = []
    b = Batch(n_ub)
    rng = np.random.default_rng(0)
    for n in [sizes[0], *sizes]:  # the first size twice: a warm-up
        ts = []
        for _ in range(repeats):
            ctx.seq_rm(0, 0, -1)
            b.clear()
            b.add_seq(rng.integers(10, 1000, n).astype(np.int32), 0, 0, logits_last=True)
            t0 = time.perf_counter()
            assert ctx.decode(b) == 0
            ts.append(time.perf_counter() - t0)
        pts.append((n, sorted(ts)[len(ts) // 2]))
    pts = pts[1:]
    xs = np.array([p[0] for p in pts], float)
    ys = np.array([p[1] for p in pts], float)
    a = np.vstack([np.ones_like(xs), xs]).T
    (t_fixed, t_token), *_ = np.linalg.lstsq(a, ys, rcond=None)
    t_token = max(float(t_token), 1e-9)
    t_fixed = max(float(t_fixed), 0.0)
    ctx.close()
    m.close()
    return SpeedModel(t_fixed, t_token, 512, f"calibrated on {Path(m.path).name}"), pts
