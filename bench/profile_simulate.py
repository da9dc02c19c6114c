"""Where `slotlab simulate` spends its time (issue 33): a cProfile of one simulation of the Mooncake
conversation trace, its own time summed by part of slotlab, then the top functions.

Parts: the decision core (slotlab/engine: selection, the RAM cache, prompt processing, checkpoints,
events), the paper memory (slotlab/memory/paper: cells, windows, the placeholder vocabulary), the
simulator around them (slotlab/sim: the clock, fast-forwards, making each prompt from its block ids),
the ideal caches beside it (slotlab/ideal), numpy and the rest. Run as `slotlab simulate` runs (no
hindsight, only the events the report folds are built). cProfile roughly doubles the time; read the
shares, not the seconds.

    python -m bench.profile_simulate [--profile llama-3.1-8b] [--limit 3000] [--flags "-np 4 --cache-ram 8192"]
                                     [--top 25] [--no-bounds]"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
if not TRACE.exists():
    TRACE = ROOT / "tests" / "sim" / "data" / "mooncake_conversation_first500.jsonl"

PARTS = (("slotlab/engine/events", "events"), ("slotlab/engine", "decision core"),
         ("slotlab/memory/paper", "paper memory"), ("slotlab/sim/fastforward", "fast-forwards"),
         ("slotlab/sim/traces", "prompts from block ids"), ("slotlab/sim", "simulator (clock, loop)"),
         ("slotlab/ideal", "ideal caches (bounds)"), ("numpy", "numpy"))


def part_of(filename: str) -> str:
    f = filename.replace("\\", "/")
    for key, name in PARTS:
        if key in f:
            return name
    return "python / other"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--profile", default="llama-3.1-8b")
    ap.add_argument("--limit", type=int, default=3000)
    ap.add_argument("--flags", default="-np 4 --cache-ram 8192")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-bounds", action="store_true")
    a = ap.parse_args(argv)
    from slotlab.memory.paper import PaperVocab
    from slotlab.memory.profile import ModelProfile
    from slotlab.sim.simulate import simulate
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_mooncake

    prof = ModelProfile.from_json(ROOT / "slotlab" / "sim" / "profiles" / f"{a.profile}.json")
    tr = load_mooncake(a.trace, limit=a.limit, hi=min(120_000, PaperVocab(prof.n_vocab).gen_lo))
    pr = cProfile.Profile()
    t0 = time.process_time()
    pr.enable()
    res = simulate(tr, a.flags.split(), speed=SpeedModel.from_rates(8000, 60), profile=prof, hindsight=False,
                   bounds=not a.no_bounds)
    pr.disable()
    cpu = time.process_time() - t0
    st = pstats.Stats(pr)
    by: dict[str, float] = defaultdict(float)
    total = 0.0
    for (fn, _line, _name), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        by[part_of(fn)] += tt
        total += tt
    t = res.totals
    print(f"{a.profile}, {t['n_requests']} requests, {a.flags}: {cpu:.1f} s CPU under cProfile, "
          f"{t['n_steps']} engine steps ({t['fast_forward_steps']} fast-forwarded in {t['fast_forwards']} bulks)")
    print(f"{'part':<26} {'own s':>7} {'share':>6}")
    for name, s in sorted(by.items(), key=lambda kv: -kv[1]):
        print(f"{name:<26} {s:>7.2f} {100 * s / total:>5.1f} %")
    print()
    st.sort_stats("tottime").print_stats(a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
