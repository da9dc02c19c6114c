"""How fast `slotlab simulate` runs: the Mooncake conversation trace (12,031 requests) with
`-np 4 --cache-ram 8192` on the Llama 3.1 8B profile. Prints requests/s and prompt tokens/s simulated
(wall clock), the CPU time, the steps fast-forwarded, the peak RSS and the load average before and
after (the machines are shared: compare wall times only at a similar load, CPU times with care, as a
loaded machine slows them too). `--plain` steps every token (no fast-forward of generation or prompt chunks, no hold-back of
requests that would only be deferred): the same results, slower.

    .venv/bin/python -m bench.simulate_speed [--limit N] [--trace PATH] [--plain]"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the whole Mooncake conversation trace lives in the shared folder beside the checkout (../shared/data);
# the repo carries a 500-request slice (tests/sim/data) for when it is not there
TRACE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
if not TRACE.exists():
    TRACE = ROOT / "tests" / "sim" / "data" / "mooncake_conversation_first500.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--flags", default="-np 4 --cache-ram 8192")
    ap.add_argument("--prefill-tps", type=float, default=8000)
    ap.add_argument("--gen-tps", type=float, default=60)
    ap.add_argument("--plain", action="store_true", help="step every token (no fast-forward)")
    a = ap.parse_args(argv)
    from slotlab.memory.profile import ModelProfile
    from slotlab.sim.simulate import progress_bar, simulate
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_mooncake

    prof = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json")
    tr = load_mooncake(a.trace, limit=a.limit)
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(tr, a.flags, speed=SpeedModel.from_rates(a.prefill_tps, a.gen_tps), profile=prof,
                   progress=progress_bar(), fast=not a.plain)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    t = res.totals
    print("\n".join(res.lines(per_request=False)))
    print(f"bench: {t['n_requests']} requests in {wall:.1f} s wall: {t['n_requests'] / wall:.1f} requests/s, "
          f"{t['prompt_tokens'] / wall:,.0f} prompt tokens/s simulated; CPU {cpu:.1f} s "
          f"({t['n_requests'] / cpu:.1f} requests/s of CPU); {t['n_steps']} decodes, "
          f"{t['fast_forward_steps']} of them in {t['fast_forwards']} fast-forwards; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
          f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
