"""What `slotlab simulate --why` costs on a recorded agent session: the recording from llama-server
b11312 (tests/golden/agent/session.jsonl, 26 chat calls, 16,125 tokens prefilled), analysed as a user
runs it — the session as sent, as a stable client would have sent it, and every flag change and client
fix over the whole session — against one plain `simulate` of the same session in the same process
(the ratio is the figure: these machines are noisy). Interleaved repeats, medians.

    .venv/bin/python -m bench.why_session [--repeats 3]"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

SESSION = Path(__file__).resolve().parents[1] / "tests" / "golden" / "agent" / "session.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from slotlab.engine.params import ServerParams
    from slotlab.sim.simulate import simulate
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_sim_trace, session_log_header
    from slotlab.why.session import analyse

    flags = list(session_log_header(SESSION)["flags"])
    params = ServerParams.from_args(flags)
    trace = load_sim_trace(str(SESSION), params=params)
    speed = SpeedModel.from_rates(8000, 60)
    plain, why, runs = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        simulate(trace, flags, speed=speed, fast=True, hindsight=False)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sw = analyse(trace, flags, speed=speed, params=params)
        why.append(time.perf_counter() - t0)
        runs.append(sw.advice.n_runs)
    p, w = statistics.median(plain), statistics.median(why)
    print(f"session: {SESSION.name}, {len(trace.requests)} calls, flags {' '.join(flags)}")
    print(f"simulate (one run):           {p:7.3f} s")
    print(f"simulate --why ({runs[0]} runs):     {w:7.3f} s   ({w / runs[0]:.3f} s a run)")
    print(f"ratio --why / one run:        {w / p:7.1f}x   (runs: the session as sent and stable with the "
          f"explainer, each client fix, each flag change)")
    print(f"saved by the stable client: {sw.pricing.saved} of {sw.pricing.processed} tokens; advice: "
          f"{sum(t.works for t in sw.advice.flags)} flag(s), {sum(t.works for t in sw.advice.client)} client fix(es)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
