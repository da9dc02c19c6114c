"""slotlab simulate against kvcache-simulator (PyPI 0.1.3, its pure-Python backend), one setting each,
in the same run on the same traces: the ratio a user waits, per memory kind (issue 33).

Per trace (the first 3,993 and all 12,031 requests of the Mooncake conversation trace) and per memory
kind (llama-3.1-8b: full attention; gemma-3-27b: iSWA; qwen3.5-27b: hybrid) both run as whole
processes, interleaved (kvcache-simulator, slotlab, slotlab, kvcache-simulator, ... with `--repeats`):

* kvcache-simulator: `kvcache-simulator run --trace T --model llama-3.1-8b --block-size 512
  --budgets-gib 8 --policies lru --backend python --no-progress --format json` (one setting: one
  budget, one policy; its cost does not depend on the model);
* slotlab: `slotlab simulate T --profile P -np 4 --cache-ram 8192 --json --no-bounds` (one setting:
  every decision of llama-server, on paper), and once more with the ideal-cache bounds it prints by
  default (`bounds` column: slotlab's own LRU / FIFO / optimal / infinite and kvcache-simulator's
  three rates at the same memory, the figures of slotlab.ideal).

Printed: per row the median wall seconds of each side (whole process, start-up included) and
slotlab / kvcache-simulator. The machine is shared: read the ratios, measured side by side.

    python -m bench.vs_kvcache_simulator [--repeats N] [--configs llama-3.1-8b,...] [--traces 3993,12031]
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


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def kvsim_cmd(trace: Path) -> list[str]:
    return [str(BIN / "kvcache-simulator"), "run", "--trace", str(trace), "--model", "llama-3.1-8b", "--block-size",
            "512", "--budgets-gib", "8", "--policies", "lru", "--backend", "python", "--no-progress", "--format",
            "json", "-o", os.devnull]


def slotlab_cmd(trace: Path, profile: str, bounds: bool) -> list[str]:
    return [sys.executable, "-m", "slotlab.cli", "simulate", str(trace), "--profile", profile, "-np", "4",
            "--cache-ram", "8192", "--json", *([] if bounds else ["--no-bounds"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--traces", default="3993,12031", help="request counts: the first N of the Mooncake trace")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if not (BIN / "kvcache-simulator").exists():
        raise SystemExit("kvcache-simulator is not installed: pip install kvcache-simulator==0.1.3 (a dev dependency)")
    tmp = Path(tempfile.mkdtemp(prefix="vs-kvsim-"))
    lines = TRACE.read_text().splitlines(True)
    rows = []
    print(f"{'trace':>6} {'config':<14} {'kvsim s':>8} {'slotlab s':>10} {'ratio':>6} {'+bounds s':>10} {'ratio':>6}")
    for n in [int(x) for x in a.traces.split(",")]:
        tr = tmp / f"mooncake_{n}.jsonl"
        tr.write_text("".join(lines[:n]))
        for cfg in a.configs.split(","):
            kv, sl, sb = [], [], []
            for rep in range(a.repeats):
                order = ("k", "s", "b") if rep % 2 == 0 else ("b", "s", "k")
                for side in order:
                    if side == "k":
                        kv.append(_wall(kvsim_cmd(tr)))
                    elif side == "s":
                        sl.append(_wall(slotlab_cmd(tr, cfg, False)))
                    else:
                        sb.append(_wall(slotlab_cmd(tr, cfg, True)))
            k, s, b = statistics.median(kv), statistics.median(sl), statistics.median(sb)
            rows.append({"requests": n, "config": cfg, "kvsim": kv, "slotlab": sl, "slotlab_bounds": sb,
                         "load": os.getloadavg()[0]})
            print(f"{n:>6} {cfg:<14} {k:>8.2f} {s:>10.2f} {s / k:>6.1f} {b:>10.2f} {b / k:>6.1f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
