"""Panel overhead: the same trace replayed headless and with the live panel attached (redrawing at most
10 times a second, as the kernel pump does), ratio of throughputs (goal >= 0.95); then the kernel's
memory growth while 100,000 events flow through an engine with the panel attached."""

from __future__ import annotations

import gc
import sys
import time
import tracemalloc

from slotlab.engine.replay import parse_trace, replay
from slotlab.engine.scheduler import Engine
from slotlab.llama import Model
from slotlab.panel import Panel


def trace() -> dict:
    doc = lambda t, n: " ".join(f"Note {i} on {t}: item {i * 7} is on shelf {i % 5}." for i in range(n))  # noqa: E731
    reqs = [{"prompt": doc(t, 12) + f" Q{k}?", "n_predict": 24} for k in range(3) for t in ("maps", "tides", "stars")]
    return {"flags": ["-np", "2", "-kvu", "-c", "4096", "--swa-full"], "requests": reqs}


def run(model, with_panel: bool) -> float:
    eng = Engine(trace()["flags"], model=model)
    panel = Panel(eng) if with_panel else None
    if panel is not None:
        last = [0.0]

        def pump(_ev):  # what the asyncio pump does: redraw at most every 100 ms
            now = time.perf_counter()
            if now - last[0] >= 0.1:
                last[0] = now
                panel.refresh()

        eng.events.subscribe(pump)
    t0 = time.perf_counter()
    replay(parse_trace(trace()), engine=eng)
    if panel is not None:
        panel.refresh()
    dt = time.perf_counter() - t0
    n = sum(t.result["tokens_evaluated"] + t.result["tokens_predicted"] for t in eng.tasks.values() if t.result)
    if panel is not None:
        panel.close()
    eng.close()
    return n / dt


def memory(model, n_events: int = 100_000) -> tuple[float, float]:
    eng = Engine(["-np", "2", "-c", "1024"], model=model)
    panel = Panel(eng)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n_events):
        eng.events.emit("cache_evict", " - cache size limit reached, removing oldest entry (size = 1.000 MiB)",
                        level="WRN", entry_id=i, reason="byte_limit", n_tokens=100, size=1 << 20)
        if i % 1000 == 0:
            panel.refresh()
    panel.refresh()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    panel.close()
    eng.close()
    return (after - base) / 2**20, len(eng.events.log)


def main() -> int:
    model = Model()
    run(model, False)  # warm up
    headless = max(run(model, False) for _ in range(2))
    live = max(run(model, True) for _ in range(2))
    r = live / headless
    print(f"panel overhead: headless {headless:.0f} tok/s, with panel {live:.0f} tok/s, ratio {r:.3f} "
          f"-> goal >= 0.95 {'met' if r >= 0.95 else 'MISSED'}")
    mib, kept = memory(model)
    print(f"memory: +{mib:.1f} MiB of Python objects after 100,000 events with the panel attached "
          f"(engine log keeps the last {kept:,}; panel state is ring-buffered)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
