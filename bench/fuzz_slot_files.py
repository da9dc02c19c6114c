"""Fuzz slot-file restore: N damaged copies of a real slot file (with its SCKP appendix) restored into
a live engine. Checks on every case: no crash, the server's error text or a clean success, the failed
slot left empty, the other slot untouched, no allocation beyond the file (the reader checks lengths).

    python -m bench.fuzz_slot_files [N]      (default 10000)"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from slotlab.engine.scheduler import Engine
from tests.golden.make_traces import doc


def main(n: int = 10_000, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    d = Path(tempfile.mkdtemp(prefix="slotlab-fuzz-"))
    e = Engine(["-np", "2", "-c", "2048", "--slot-save-path", str(d), "--slot-appendices"])

    def run(t):
        e.run_until(lambda: t.done)
        return t

    run(e.submit(doc("sagas", 3), n_predict=2, id_slot=0))
    body = run(e.slot_action("save", 0, "good.bin")).result["n_written"]
    good = (d / "good.bin").read_bytes()
    run(e.submit(doc("fjords", 2), n_predict=2, id_slot=1))
    other = (e.slots[1].tokens.tolist(), e.ctx.seq_pos_max(1))
    outcomes: collections.Counter = collections.Counter()
    t0 = time.perf_counter()
    for i in range(n):
        buf = bytearray(good)
        kind = rng.integers(0, 4)
        if kind == 0:  # truncate anywhere
            buf = buf[: rng.integers(0, len(buf))]
        elif kind == 1:  # flip bytes in the header / token payload or the tail (state end + appendix)
            for _ in range(rng.integers(1, 5)):
                where = rng.integers(0, 64) if rng.random() < 0.5 else rng.integers(body - 8, len(buf))
                buf[where] = rng.integers(0, 256)
        elif kind == 2:  # a huge length field somewhere in the appendix
            off = rng.integers(body, len(buf) - 8)
            buf[off:off + 8] = int(rng.integers(2**40, 2**63)).to_bytes(8, "little")
        else:  # random bytes after a valid header
            tail = rng.integers(0, 256, size=rng.integers(0, 4096), dtype=np.uint8).tobytes()
            buf = buf[: rng.integers(12, body)] + tail
        (d / "bad.bin").write_bytes(bytes(buf))
        r = run(e.slot_action("restore", 0, "bad.bin"))
        s0 = e.slots[0]
        if r.error is not None:
            assert r.error.code == 400 and r.error.message.startswith("Unable to restore slot: "), r.error.message
            assert len(s0.tokens) == 0 and e.ctx.seq_pos_max(0) == -1
            outcomes[r.error.message.removeprefix("Unable to restore slot: ")] += 1
        else:
            assert e.ctx.seq_pos_max(0) == len(s0.tokens) - 1
            outcomes[f"restored ({len(s0.checkpoints)} checkpoints)"] += 1
        assert (e.slots[1].tokens.tolist(), e.ctx.seq_pos_max(1)) == other, f"case {i} touched slot 1"
        if (i + 1) % 1000 == 0:
            print(f"  {i + 1}/{n} cases, {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    dt = time.perf_counter() - t0
    print(f"fuzz_slot_files: {n} damaged files restored in {dt:.1f} s ({n / dt:.0f}/s), file {len(good)} bytes "
          f"(body {body}), no crash, every invariant held")
    for k, v in outcomes.most_common():
        print(f"  {v:6d}  {k}")
    e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000))
