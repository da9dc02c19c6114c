"""Fast against plain stepping on slices of the Mooncake trace never used by the tests (issue 33's
proof that the speed-ups decide nothing differently): per configuration a random slice of 250-400
requests (every k-th from a random start: light to full load), simulated with `fast=True` (the
fast-forwards, the bulk memory paths, the precomputed placeholders) and `fast=False` (one engine step
at a time), and every per-request result and total compared. Memory kinds: full attention, iSWA
(with and without --swa-full, -kvu), a 128-token window, hybrid delta-net and Mamba-2; RAM cache on
and off, --cache-reuse, 2-8 slots; the GPU speed model (attention terms) and plain rates.

    python -m bench.fast_vs_plain [--seed 5] [--requests 250] [--every-div 1]

Exits 1 if any configuration differs."""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "sim" / "data" / "mooncake_conversation_trace.jsonl"

# (profile, flags, every k-th request of the trace, speed model: "gpu" = RTX 4090 estimate, "rates" = 8000 / 60)
CONFIGS = [
    ("gemma-3-27b", "-np 4 --cache-ram 8192", 24, "gpu"),
    ("llama-3.1-8b", "-np 4 --cache-ram 8192", 16, "gpu"),
    ("qwen3.5-27b", "-np 2 --cache-ram 4096", 12, "gpu"),
    ("gemma-3-27b", "-np 2 -kvu -c 65536 --cache-ram 2048", 8, "gpu"),
    ("llama-3.1-8b", "-np 8 --cache-ram 0", 6, "rates"),
    ("gpt-oss-20b", "-np 4 --cache-ram 8192", 20, "gpu"),
    ("granite-4.0-h-small", "-np 3 --cache-ram 8192", 10, "gpu"),
    ("gemma-3-27b", "-np 4 --cache-ram 8192 --swa-full", 30, "rates"),
    ("qwen3.5-27b", "-np 4 -kvu --cache-ram 8192", 20, "gpu"),
    ("llama-3.1-8b", "-np 2 --cache-ram 8192 --cache-reuse 256", 10, "gpu"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--requests", type=int, default=250)
    ap.add_argument("--every-div", type=int, default=1, help="divide each slice's stride (heavier load)")
    a = ap.parse_args(argv)
    from slotlab.fleet.servers import subtrace
    from slotlab.memory.paper import PaperVocab
    from slotlab.sim import gpus
    from slotlab.sim.cli import resolve_profile
    from slotlab.sim.simulate import simulate
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_mooncake

    rng = random.Random(a.seed)
    bad = 0
    for prof_name, flags, every, sp_kind in CONFIGS:
        every = max(1, every // a.every_div)
        prof = resolve_profile(prof_name)
        sp = gpus.speed_for(prof, "rtx-4090") if sp_kind == "gpu" else SpeedModel.from_rates(8000, 60)
        tr = load_mooncake(TRACE, hi=min(120_000, PaperVocab(prof.n_vocab).gen_lo))
        off, start = rng.randrange(every), rng.randrange(0, 6000)
        idx = [i for i in range(start, len(tr.requests)) if i % every == off][:a.requests]
        out = []
        for fast in (True, False):
            t0 = time.process_time()
            r = simulate(subtrace(tr, idx), flags.split(), speed=sp, profile=prof, fast=fast, hindsight=False)
            tot = {k: v for k, v in r.totals.items() if k not in ("wall_seconds", "fast_forwards", "fast_forward_steps")}
            out.append((r.results, tot, time.process_time() - t0))
        same = out[0][0] == out[1][0] and out[0][1] == out[1][1]
        bad += not same
        nd = sum(1 for x, y in zip(out[0][0], out[1][0]) if x != y)
        print(f"{prof_name:20s} {flags:45s} every {every:2d} from {start:4d}: "
              f"{'same' if same else f'DIFFERENT ({nd} requests)'}  fast {out[0][2]:.1f} s, plain {out[1][2]:.1f} s", flush=True)
    print("every configuration the same" if not bad else f"{bad} configurations differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
