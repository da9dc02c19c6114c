"""`python -m bench.fleet [--full] [--servers 1,4,16] [--workers 2]`: wall seconds of `slotlab simulate
--fleet N` (Llama 3.1 8B profile, -np 4 --cache-ram 8192, --time-scale 16, 8000 / 60 tok/s) on the
500-request Mooncake slice (and, with --full, on the whole conversation trace), servers x requests:
a static router (prefix) serially and as Dask tasks on a LocalCluster of worker processes (started
once, its start-up timed apart; the workers load the trace from the scattered bytes, as they would on
a remote cluster), and least-loaded, which runs in lockstep in this process (its server runs and
re-runs counted). Each Dask run must equal the serial one figure for figure (wall times excepted), or
the bench fails."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLICE = ROOT / "tests/sim/data/mooncake_conversation_first500.jsonl"
FULL = [ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl",
        Path("/work/shared/data/mooncake/conversation_trace.jsonl")]
FLAGS = "-np 4 --cache-ram 8192".split()
SCALE = 16


def _figures(res) -> tuple:
    no_wall = lambda t: {k: v for k, v in t.items() if k != "wall_seconds"}  # noqa: E731
    return res.results, res.routing, no_wall(res.totals), [no_wall(s["totals"]) for s in res.servers]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="also the whole conversation trace (shared/data/mooncake)")
    ap.add_argument("--servers", default="1,4,16")
    ap.add_argument("--workers", type=int, default=2, help="Dask worker processes")
    ap.add_argument("--router", default="prefix", help="the static router timed serial / Dask")
    ap.add_argument("--no-least-loaded", action="store_true")
    args = ap.parse_args(argv)
    from slotlab.fleet import simulate_fleet
    from slotlab.memory.paper import PaperVocab
    from slotlab.sim.cli import resolve_profile
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_mooncake

    speed, profile = SpeedModel.from_rates(8000, 60), resolve_profile("llama-3.1-8b")
    hi = min(120_000, PaperVocab(profile.n_vocab).gen_lo)
    traces = [SLICE] + ([p for p in FULL if p.exists()][:1] if args.full else [])
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        LocalCluster = None
        print("dask is not installed (pip install 'slotlab[dask]'): the Dask mode is skipped")
    cluster = client = None
    if LocalCluster is not None:
        t0 = time.perf_counter()
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        print(f"LocalCluster of {args.workers} worker processes started in {time.perf_counter() - t0:.1f} s")
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start")
    rows = []
    try:
        for path in traces:
            trace = load_mooncake(path, time_scale=SCALE, hi=hi)
            source = {"path": str(path), "limit": None, "time_scale": SCALE, "load_kw": {"hi": hi}, "flags": FLAGS}
            for n in [int(x) for x in args.servers.split(",")]:
                kw = dict(speed=speed, profile=profile)
                t0 = time.perf_counter()
                ser = simulate_fleet(trace, FLAGS, n, args.router, **kw)
                rows.append((path.name, len(trace.requests), n, args.router, "serial", time.perf_counter() - t0, n,
                             ser.totals))
                if client is not None:
                    t0 = time.perf_counter()
                    dk = simulate_fleet(trace, FLAGS, n, args.router, scheduler=client, source=source, **kw)
                    rows.append((path.name, len(trace.requests), n, args.router, f"Dask ({args.workers} workers)",
                                 time.perf_counter() - t0, n, dk.totals))
                    if _figures(dk) != _figures(ser):
                        print(f"bench.fleet: Dask and serial differ for {path.name}, {n} servers", file=sys.stderr)
                        return 1
                if not args.no_least_loaded:
                    t0 = time.perf_counter()
                    ll = simulate_fleet(trace, FLAGS, n, "least-loaded", **kw)
                    rows.append((path.name, len(trace.requests), n, "least-loaded", "lockstep",
                                 time.perf_counter() - t0, ll.stats["server_runs"], ll.totals))
                print(f"  {path.name}: {n} servers done", flush=True)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    head = ("trace", "requests", "servers", "router", "mode", "wall s", "server runs", "reused", "TTFT p50", "TTFT p99")
    pct = lambda t: f"{100 * t['tokens_reused'] / t['prompt_tokens']:.1f} %"  # noqa: E731
    table = [head] + [(a, str(b), str(c), d, e, f"{w:.1f}", str(k), pct(t), f"{t['ttft_p50']:.2f}",
                       f"{t['ttft_p99']:.2f}") for a, b, c, d, e, w, k, t in rows]
    wd = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(x.rjust(wd[i]) if i in (1, 2, 5, 6, 7, 8, 9) else x.ljust(wd[i]) for i, x in enumerate(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
