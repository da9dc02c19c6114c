"""slotlab against kvcache-simulator (PyPI 0.1.3, its pure-Python backend), in the same run on the same
traces: the ratio a user waits, per memory kind, for one setting, a 20-point grid and a fleet (issue 33).

Per trace (the first 3,993 and all 12,031 requests of the Mooncake conversation trace) both run as whole
processes (start-up included), interleaved (A B C ..., then ... C B A, with `--repeats`):

* one setting, per memory kind (llama-3.1-8b: full attention; gemma-3-27b: iSWA; qwen3.5-27b: hybrid):
  kvcache-simulator `run --trace T --model llama-3.1-8b --block-size 512 --budgets-gib 8 --policies lru
  --backend python --no-progress --format json` (its cost does not depend on the model) against slotlab
  `simulate T --profile P -np 4 --cache-ram 8192 --json --no-bounds` (every decision of llama-server, on
  paper), and once more with the ideal-cache bounds `simulate` prints by default (`+bounds`);
* `--grid`: 20 settings each, two worker processes each: kvcache-simulator with ten budgets (0.5 to 64
  GiB) x fifo, lru (`--jobs 2`) against `slotlab whatif T --vary "--cache-ram 0,1024,2048,4096,8192"
  --vary "-np 1,2,4,8" --jobs 2 --json` (llama-3.1-8b);
* `--fleet`: `slotlab simulate T --fleet 4 --router prefix -np 4 --cache-ram 8192 --json` (four servers
  behind a prefix router, llama-3.1-8b) against kvcache-simulator's one setting.

`--before PATH` also runs slotlab from another checkout (a worktree of the previous release, e.g.
`git worktree add --detach /tmp/speed-before 4cb1964`) in every row, without bounds: the `before`
column and after / before.

Printed: per row the median wall seconds of each side and slotlab / kvcache-simulator. The machine is
shared: read the ratios, measured side by side.

`--synthetic 20000,100000`: the same rows on synthetic Mooncake-format traces of that many requests
(`synthetic`: shared system prompts, growing conversations; traces slotlab has never seen), to see
whether the cost per request stays flat as traces grow.

    python -m bench.vs_kvcache_simulator [--repeats N] [--configs llama-3.1-8b,...] [--traces 3993,12031]
                                         [--synthetic 20000,100000] [--grid] [--fleet] [--before PATH]
                                         [--json FILE]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
if not TRACE.exists():
    TRACE = Path("/work/shared/data/mooncake/conversation_trace.jsonl")
CONFIGS = ("llama-3.1-8b", "gemma-3-27b", "qwen3.5-27b")
BIN = Path(sys.executable).parent


def _wall(cmd: list[str], root: Path = ROOT) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root)})
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def kvsim_cmd(trace: Path, grid: bool = False) -> list[str]:
    budgets, policies, jobs = ("0.5,1,2,4,8,12,16,24,32,64", "fifo,lru", ["--jobs", "2"]) if grid else ("8", "lru", [])
    return [str(BIN / "kvcache-simulator"), "run", "--trace", str(trace), "--model", "llama-3.1-8b", "--block-size",
            "512", "--budgets-gib", budgets, "--policies", policies, "--backend", "python", *jobs, "--no-progress",
            "--format", "json", "-o", os.devnull]


def slotlab_cmd(trace: Path, profile: str, bounds: bool) -> list[str]:
    return [sys.executable, "-m", "slotlab.cli", "simulate", str(trace), "--profile", profile, "-np", "4",
            "--cache-ram", "8192", "--json", *([] if bounds else ["--no-bounds"])]


def grid_cmd(trace: Path) -> list[str]:
    return [sys.executable, "-m", "slotlab.cli", "whatif", str(trace), "--profile", "llama-3.1-8b", "--vary",
            "--cache-ram 0,1024,2048,4096,8192", "--vary", "-np 1,2,4,8", "--jobs", "2", "--json"]


def fleet_cmd(trace: Path) -> list[str]:
    return [sys.executable, "-m", "slotlab.cli", "simulate", str(trace), "--profile", "llama-3.1-8b", "--fleet", "4",
            "--router", "prefix", "-np", "4", "--cache-ram", "8192", "--json"]


def synthetic(n: int, seed: int = 33) -> list[str]:
    """A Mooncake-format trace of `n` requests slotlab has never seen (issue 33's proof: timed on traces
    it has not seen): conversations that share one of 24 system prompts (2-12 blocks, Zipf-like), each
    turn's hash_ids its conversation's so far plus 1-6 new blocks (the reply and the next message), the
    last block cut short; replies log-normal around 300 tokens; a new conversation 40 % of the time
    (else a turn of one of the 64 most recent), Poisson arrivals at 3.4 a second (the conversation
    trace's rate)."""
    import random

    rng = random.Random(seed)
    nxt = [0]

    def fresh(k: int) -> list[int]:
        ids = list(range(nxt[0], nxt[0] + k))
        nxt[0] += k
        return ids

    systems = [fresh(rng.randint(2, 12)) for _ in range(24)]
    weights = [1 / (i + 1) for i in range(len(systems))]
    live: list[list[int]] = []
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(3.4)
        if not live or rng.random() < 0.4:
            h = list(rng.choices(systems, weights)[0]) + fresh(rng.randint(1, 4))
            live.append(h)
            live[:] = live[-64:]
        else:
            h = rng.choice(live)
            h += fresh(rng.randint(1, 6))
        if len(h) > 60:  # a conversation past ~30k tokens ends; its slot in `live` starts a new one
            h[:] = list(rng.choices(systems, weights)[0]) + fresh(2)
        inp = len(h) * 512 - rng.randint(0, 511)
        outl = max(1, min(2000, int(rng.lognormvariate(5.5, 0.8))))
        out.append(json.dumps({"timestamp": int(t * 1000), "input_length": inp, "output_length": outl,
                               "hash_ids": list(h)}) + "\n")
    return out


def _row(n: int, name: str, sides: dict, repeats: int) -> dict:
    """Each side's wall seconds over `repeats` interleaved rounds (the order reversed every other round)."""
    walls: dict[str, list[float]] = {k: [] for k in sides}
    for rep in range(repeats):
        for k in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
            walls[k].append(_wall(*sides[k]))
    med = {k: statistics.median(v) for k, v in walls.items()}
    kv = med["kvsim"]
    cells = [f"{med[k]:>8.2f} {med[k] / kv:>5.1f}" for k in sides if k != "kvsim"]
    extra = f" after/before {med['slotlab'] / med['before']:.2f}" if "before" in med else ""
    print(f"{n:>6} {name:<16} {kv:>8.2f}  " + "  ".join(cells) + extra, flush=True)
    return {"requests": n, "config": name, **walls, "load": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--traces", default="3993,12031", help="request counts: the first N of the Mooncake trace")
    ap.add_argument("--synthetic", default="", help="request counts of synthetic traces (never seen), e.g. 20000,100000")
    ap.add_argument("--grid", action="store_true", help="also a 20-point grid each (two workers each)")
    ap.add_argument("--fleet", action="store_true", help="also slotlab simulate --fleet 4 --router prefix")
    ap.add_argument("--before", help="also run slotlab from this checkout (a worktree of the previous release)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not (BIN / "kvcache-simulator").exists():
        raise SystemExit("kvcache-simulator is not installed: pip install kvcache-simulator==0.1.3 (a dev dependency)")
    before = Path(a.before).resolve() if a.before else None
    tmp = Path(tempfile.mkdtemp(prefix="vs-kvsim-"))
    lines = TRACE.read_text().splitlines(True)
    rows = []
    print(f"load average {os.getloadavg()[0]:.1f}; columns: kvcache-simulator s, then per slotlab side its s and "
          "its ratio to kvcache-simulator (slotlab, [+bounds,] [before])")
    todo = [(int(x), "mooncake") for x in a.traces.split(",") if x] + [(int(x), "synthetic")
                                                                     for x in a.synthetic.split(",") if x]
    for n, kind in todo:
        tr = tmp / f"{kind}_{n}.jsonl"
        tr.write_text("".join(lines[:n] if kind == "mooncake" else synthetic(n)))
        if kind == "synthetic":
            print(f"synthetic trace of {n} requests:", flush=True)
        for cfg in [c for c in a.configs.split(",") if c]:
            sides = {"kvsim": (kvsim_cmd(tr),), "slotlab": (slotlab_cmd(tr, cfg, False),),
                     "slotlab_bounds": (slotlab_cmd(tr, cfg, True),)}
            if before is not None:
                sides["before"] = (slotlab_cmd(tr, cfg, False), before)
            rows.append(_row(n, cfg, sides, a.repeats))
        if a.grid:
            sides = {"kvsim": (kvsim_cmd(tr, grid=True),), "slotlab": (grid_cmd(tr),)}
            if before is not None:
                sides["before"] = (grid_cmd(tr), before)
            rows.append(_row(n, "grid of 20", sides, a.repeats))
        if a.fleet:
            sides = {"kvsim": (kvsim_cmd(tr),), "slotlab": (fleet_cmd(tr),)}
            if before is not None:
                sides["before"] = (fleet_cmd(tr), before)
            rows.append(_row(n, "fleet of 4", sides, a.repeats))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
