"""RAM-cache operations against memory bandwidth: `prompt_save` (size query, allocation, state copy
out) and the restore half of `prompt_load` (state copy in) for slots of 1k-16k tokens, in MB/s, next
to a numpy copy of the same number of bytes in the same run. Goal >= 0.5x the copy bandwidth.

Two baselines: a copy into an existing buffer, and an allocating copy (`buf.copy()`), which is what a
save is (the entry's buffer is new memory each time: its first touch costs page faults that a copy
into a warm buffer does not pay). slotlab adds no Python-side copy: sizes and pointers go straight to
`llama_state_seq_get/set_data_ext`."""

from __future__ import annotations

import sys
import time

import numpy as np

from slotlab.engine.scheduler import Engine


def best(fn, reps: int = 5) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main(sizes=(1024, 4096, 16384)) -> int:
    eng = Engine(["-np", "1", "-c", str(max(sizes) + 256), "--swa-full", "--cache-ram", "-1", "-b", "2048"])
    slot = eng.slots[0]
    print(f"{'tokens':>7} {'MiB':>8} {'save MB/s':>10} {'load MB/s':>10} {'copy MB/s':>10} {'alloc+copy':>10} "
          f"{'save/(alloc+copy)':>17} {'load/copy':>9}")
    worst = 1e9
    for n in sizes:
        eng.slots[0].tokens.clear()
        eng.ctx.clear()
        toks = np.random.default_rng(n).integers(1000, 20000, size=n, dtype=np.int32)
        toks[0] = 2
        t = eng.submit(toks, n_predict=1)
        eng.run_until(lambda: t.done)
        size = eng.ctx.state_seq_size(0)

        def save():
            eng.cache.entries.clear()
            assert eng.prompt_save(slot)

        save()
        entry = eng.cache.entries[0]
        buf = np.array(entry.main, copy=True)
        t_save = best(save)
        t_load = best(lambda: eng.ctx.state_seq_set(buf, 0))
        dst = np.empty_like(buf)
        t_copy = best(lambda: np.copyto(dst, buf))
        t_acopy = best(lambda: buf.copy())
        mb = size / 1e6
        r_s, r_l = t_acopy / t_save, t_copy / t_load
        worst = min(worst, r_s, r_l)
        print(f"{n:>7} {size / 2**20:>8.1f} {mb / t_save:>10.0f} {mb / t_load:>10.0f} {mb / t_copy:>10.0f} "
              f"{mb / t_acopy:>10.0f} {r_s:>17.2f} {r_l:>9.2f}")
    print(f"goal: >= 0.5x the copy bandwidth: worst {worst:.2f}x -> {'met' if worst >= 0.5 else 'MISSED'}"
          " (load is llama.cpp's own state_seq_set: per-layer tensor writes, no Python in the loop)")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
