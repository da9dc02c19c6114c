"""Scale: 8 and 16 slots, -c 32768, a RAM cache holding 200 entries. How much of each decode step is
the scheduler: everything outside `llama_decode` and the samplers (which the server runs too),
averaged over the run (the first step also launches every task and scores 200 entries per launch)."""

from __future__ import annotations

import sys
import time

import numpy as np

from slotlab.engine.prompt_cache import CacheEntry
from slotlab.engine.scheduler import Engine
from slotlab.llama import Model


def main() -> int:
    model = Model()
    rng = np.random.default_rng(0)
    print(f"{'slots':>5} {'steps':>6} {'step ms':>8} {'decode ms':>9} {'sample ms':>9} {'scheduler ms':>12} {'fraction':>8}")
    for n_slots in (8, 16):
        eng = Engine(["-np", str(n_slots), "-kvu", "-c", "32768", "--swa-full", "-sps", "0"], model=model)
        # 200 synthetic entries (tokens only: their scoring is what every selection pays)
        eng.cache.entries = [CacheEntry(tokens=rng.integers(1000, 30000, size=int(rng.integers(256, 4096)), dtype=np.int32),
                                        checkpoints=[], main=np.zeros(16, np.uint8), drft=b"", id=10_000 + i)
                             for i in range(200)]
        spent = [0.0]
        raw = eng.ctx.decode

        def timed(*a, **k):
            t0 = time.perf_counter()
            r = raw(*a, **k)
            spent[0] += time.perf_counter() - t0
            return r

        eng.ctx.decode = timed
        from slotlab.llama import sampling

        sampled = [0.0]
        raw_sample = sampling.Sampler.sample

        def timed_sample(self, ctx, idx):
            t0 = time.perf_counter()
            r = raw_sample(self, ctx, idx)
            sampled[0] += time.perf_counter() - t0
            return r

        sampling.Sampler.sample = timed_sample
        for i in range(n_slots):
            eng.submit(f"Request {i}: " + "tell me about slots and caches. " * 8, n_predict=32, ignore_eos=True)
        steps = 0
        t0 = time.perf_counter()
        while eng.step():
            steps += 1
        total = time.perf_counter() - t0
        sampling.Sampler.sample = raw_sample
        sched = total - spent[0] - sampled[0]
        print(f"{n_slots:>5} {steps:>6} {total / steps * 1e3:>8.2f} {spent[0] / steps * 1e3:>9.2f} "
              f"{sampled[0] / steps * 1e3:>9.2f} {sched / steps * 1e3:>12.3f} {sched / total:>8.1%}")
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
