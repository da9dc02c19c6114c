"""slotlab against the reference llama-server on the same traces, same threads, `--no-repack` on both
sides, same batch sizes. Prints wall time, prompt and generation throughput (from each side's own
per-request timings) and the ratios. Goals: wall <= 1.10x the server's, throughput >= 0.95x.

    python -m bench.engine_vs_server          (needs `make llama-server`; skipped with a message otherwise)"""

from __future__ import annotations

import sys
import time

from bench.build_llama_server import server_binary
from slotlab.engine.replay import parse_trace, replay
from slotlab.llama import Model, default_model_path


def doc(topic: str, n: int, seed: int = 0) -> str:
    return " ".join(f"Note {seed}.{i} on {topic}: item {i * 7 + seed} is filed under shelf {i % 5}." for i in range(n))


def traces() -> dict[str, dict]:
    sys_p = "You are a concise assistant for a travel agency. " + doc("policies", 10)
    chat = []
    for turn in range(3):
        for u in ("Ana", "Ben", "Chen"):
            past = "".join(f"\nUser {u}: question {k}\nAssistant: answer {k}." for k in range(turn))
            chat.append({"prompt": f"{sys_p}{past}\nUser {u}: question {turn}", "n_predict": 16})
    long_docs = [doc(t, 90, i) for i, t in enumerate(("atlases", "harbours", "comets"))]
    longp = [{"prompt": long_docs[i % 3] + f" Question {i}?", "n_predict": 8} for i in range(9)]
    conc = [{"prompt": doc(t, 6, i), "n_predict": 96, "wait": False} for i, t in enumerate(("a", "b", "c", "d"))]
    return {
        "multi-user chat (defaults, --swa-full)": {"flags": ["-c", "8192", "--swa-full"], "requests": chat},
        "long prompts, RAM-cache hits": {"flags": ["-np", "1", "-c", "4096", "-sps", "0", "--swa-full"], "requests": longp},
        "4 slots generating concurrently": {"flags": ["-np", "4", "-c", "4096"], "requests": conc},
    }


def rates(bodies: list[dict]) -> tuple[float, float]:
    pn = sum(b["timings"]["prompt_n"] for b in bodies)
    pms = sum(b["timings"]["prompt_ms"] for b in bodies)
    gn = sum(max(0, b["timings"]["predicted_n"] - 1) for b in bodies)
    gms = sum(b["timings"]["predicted_ms"] for b in bodies)
    return (pn / pms * 1e3 if pms else 0.0), (gn / gms * 1e3 if gms else 0.0)


def main() -> int:
    if server_binary() is None:
        print("engine_vs_server: skipped - llama-server is not built (run `make llama-server`)")
        return 0
    from tests.golden.llama_server import LlamaServer
    from tests.golden.record_traces import send_trace

    model = Model()
    print(f"{'trace':40s} {'side':10s} {'wall s':>7} {'prompt tok/s':>12} {'gen tok/s':>10}")
    verdicts = []
    for name, tr in traces().items():
        trace = parse_trace(tr)
        from slotlab.engine.scheduler import Engine

        eng = Engine(list(tr["flags"]), model=model)  # start-up is outside the timing on both sides
        t0 = time.perf_counter()
        replay(trace, engine=eng)
        wall_s = time.perf_counter() - t0
        bodies = [t.result for t in eng.tasks.values() if t.result and "timings" in t.result]
        p_s, g_s = rates(bodies)
        eng.close()
        with LlamaServer(default_model_path(), list(tr["flags"])) as srv:
            t0 = time.perf_counter()
            _, raw = send_trace(srv, trace)
            wall_r = time.perf_counter() - t0
        p_r, g_r = rates([b for b in raw if b])
        print(f"{name:40s} {'slotlab':10s} {wall_s:7.2f} {p_s:12.0f} {g_s:10.1f}")
        print(f"{'':40s} {'server':10s} {wall_r:7.2f} {p_r:12.0f} {g_r:10.1f}")
        rw, rp, rg = wall_s / wall_r, p_s / p_r if p_r else 0, g_s / g_r if g_r else 0
        ok = rw <= 1.10 and rp >= 0.95 and rg >= 0.95
        verdicts.append(ok)
        print(f"{'':40s} {'ratio':10s} {rw:7.2f} {rp:12.2f} {rg:10.2f}   {'goals met' if ok else 'goal MISSED'}")
    print("all goals met" if all(verdicts) else "some goals missed (see above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
