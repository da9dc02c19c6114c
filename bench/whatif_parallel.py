"""`python -m bench.whatif_parallel [--limit 2000] [--repeats 2] [--workers 2]`: one 12-run `slotlab
whatif` grid (--cache-ram 0,1024,8192 x -np 1,2,4,8, Llama 3.1 8B profile, 8000 / 60 tok/s) on the
Mooncake conversation trace, three ways: serial (--jobs 1), a process pool (--jobs N) and a Dask
LocalCluster of N worker processes (--scheduler; started once, before the timings, its start-up timed
apart). The modes run interleaved (A B C, C B A, ...) so a neighbour's load falls on all of them; each
mode's runs must equal the serial ones figure for figure (wall times excepted), or the bench fails."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = [ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl",
          Path("/work/shared/data/mooncake/conversation_trace.jsonl")]
VARIES = [("--cache-ram", ["0", "1024", "8192"]), ("-np", ["1", "2", "4", "8"])]


def _figures(runs) -> list[dict]:
    return [{k: v for k, v in asdict(r).items() if k != "wall_seconds"} for r in runs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=next((str(p) for p in TRACES if p.exists()), None))
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the three modes (alternating order)")
    ap.add_argument("--workers", type=int, default=2, help="pool processes and Dask workers")
    ap.add_argument("--profile", default="llama-3.1-8b")
    args = ap.parse_args(argv)
    if not args.trace or not Path(args.trace).exists():
        print("bench.whatif_parallel: no Mooncake conversation trace (shared/data/mooncake/); --trace PATH")
        return 0
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.whatif import run_grid

    speed = SpeedModel.from_rates(8000, 60)
    kw = dict(speed=speed, profile=args.profile, limit=args.limit)
    try:
        from dask.distributed import LocalCluster
    except ImportError:
        LocalCluster = None
        print("dask is not installed (pip install 'slotlab[dask]'): the Dask mode is skipped")
    cluster = None
    if LocalCluster is not None:
        t0 = time.perf_counter()
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        print(f"LocalCluster of {args.workers} worker processes started in {time.perf_counter() - t0:.1f} s")
    modes = {"serial (--jobs 1)": dict(jobs=1), f"pool (--jobs {args.workers})": dict(jobs=args.workers)}
    if cluster is not None:
        modes[f"Dask LocalCluster ({args.workers} workers)"] = dict(scheduler=cluster.scheduler_address)
    walls: dict[str, list[float]] = {m: [] for m in modes}
    want = None
    print(f"{args.trace}, --limit {args.limit}, 12 runs, {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f} at the start")
    try:
        for rep in range(args.repeats):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))
            for m in order:
                t0 = time.perf_counter()
                runs = run_grid(args.trace, [], VARIES, jobs=modes[m].get("jobs"), scheduler=modes[m].get("scheduler"),
                                **kw)
                walls[m].append(time.perf_counter() - t0)
                errs = [r.error for r in runs if r.error]
                if errs:
                    print(f"{m}: {errs[0]}")
                    return 1
                if want is None:
                    want = _figures(runs)
                elif _figures(runs) != want:
                    print(f"{m}: the runs differ from the first mode's")
                    return 1
                print(f"  round {rep + 1} {m}: {walls[m][-1]:.1f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    base = walls["serial (--jobs 1)"]
    print("\n| mode | wall per round (s) | vs serial, per round |\n|---|---|---|")
    for m, w in walls.items():
        print(f"| {m} | {', '.join(f'{x:.1f}' for x in w)} | {', '.join(f'{x / b:.2f}x' for x, b in zip(w, base))} |")
    print("every mode's 12 runs equal the serial runs (wall times excepted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
