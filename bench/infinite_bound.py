"""The infinite-cache bound `slotlab simulate` reports on every run (`totals["infinite_cache_tokens"]`):
the one-pass `slotlab.ideal.infinite_hit_tokens` against the plan it replaced
(`infinite(slotlab_plan(..., next_use=False))`), on the Mooncake conversation trace, interleaved
repeats, the same answer checked every time.

    python -m bench.infinite_bound [--trace PATH] [--repeats 5]"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from slotlab import ideal as I
from slotlab.ideal.policies import infinite
from slotlab.sim.traces import load_mooncake

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    tr = load_mooncake(a.trace)
    reqs = tr.requests
    rng = random.Random(0)
    mask = [rng.random() < 0.9 for _ in reqs]  # some requests failed, as in a real run
    one, plan = [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        r = infinite(I.slotlab_plan(reqs, tr.block, next_use=False), mask)
        t1 = time.perf_counter()
        got = I.infinite_hit_tokens(reqs, tr.block, mask)
        t2 = time.perf_counter()
        if got != (r.hit_tokens, r.total_tokens):
            raise SystemExit(f"different answers: {got} vs {(r.hit_tokens, r.total_tokens)}")
        plan.append(t1 - t0)
        one.append(t2 - t1)
    p, o = statistics.median(plan), statistics.median(one)
    print(f"{len(reqs)} requests, block {tr.block}: plan + infinite {p:.3f} s, one pass {o:.3f} s, "
          f"one pass / plan {o / p:.2f} (median of {a.repeats}; hits {got[0]} of {got[1]} tokens, the same)")


if __name__ == "__main__":
    main()
