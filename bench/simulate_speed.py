"""How fast `slotlab simulate` runs: the Mooncake conversation trace (12,031 requests) with
`-np 4 --cache-ram 8192` on the Llama 3.1 8B profile. Prints requests/s and prompt tokens/s simulated
(wall clock) and the peak RSS.

    .venv/bin/python -m bench.simulate_speed [--limit N] [--trace PATH]"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = Path("/work/shared/data/mooncake/conversation_trace.jsonl")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int)
    ap.add_argument("--flags", default="-np 4 --cache-ram 8192")
    ap.add_argument("--prefill-tps", type=float, default=8000)
    ap.add_argument("--gen-tps", type=float, default=60)
    a = ap.parse_args(argv)
    from slotlab.memory.profile import ModelProfile
    from slotlab.sim.simulate import progress_bar, simulate
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_mooncake

    prof = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json")
    tr = load_mooncake(a.trace, limit=a.limit)
    t0 = time.perf_counter()
    res = simulate(tr, a.flags, speed=SpeedModel.from_rates(a.prefill_tps, a.gen_tps), profile=prof,
                   progress=progress_bar())
    wall = time.perf_counter() - t0
    t = res.totals
    print("\n".join(res.lines(per_request=False)))
    print(f"bench: {t['n_requests']} requests in {wall:.1f} s wall: {t['n_requests'] / wall:.1f} requests/s, "
          f"{t['prompt_tokens'] / wall:,.0f} prompt tokens/s simulated; {t['n_steps']} decodes; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
