"""`make bench`: every benchmark, one after the other (each prints its own figures and ratios)."""

import subprocess
import sys

BENCHES = ["bench.engine_vs_server", "bench.cache_bandwidth", "bench.cache_lookup", "bench.panel_overhead", "bench.scale",
           "bench.fuzz_slot_files", "bench.sim_vs_measured", "bench.whatif_parallel",
           "bench.fleet", "bench.fast_vs_plain", "bench.infinite_bound"]

if __name__ == "__main__":
    rc = 0
    for b in BENCHES:
        print(f"\n== {b}", flush=True)
        rc |= subprocess.call([sys.executable, "-m", b])
    sys.exit(rc)
