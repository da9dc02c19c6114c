"""Simulated vs measured time (issue 12): does `slotlab simulate`'s calibrated clock give each request the
prompt and generation time the real engine takes?

In one run, interleaved (`--repeats` rounds, default 9): calibrate the speed model on the real model,
half of the calibration before the traces and half after them, pooled (the host's speed drifts)
(`slotlab.sim.speed.measure`, what `slotlab calibrate` fits: a calibration workload through slotlab's
`Engine`, every step and `llama_decode` timed; the server's defaults with `-c 4096`, not the traces'
flags), then replay each golden trace on the real engine (slotlab's `Engine` on the embedded model,
step mode, `-t 2 --no-repack`), recording every request's `prompt_ms` and `predicted_ms` (and every
step, in the JSON). Then each round's speed model is fitted to that round's calibration (the machine
in the state the round's traces met: a busy machine slows both alike) and each trace is simulated on
the paper memory with it (`slotlab.sim.simulate`), with the real answers' tokens as the scripted outputs and the arrivals
`slotlab replay` makes: a request with `"wait": false` lets the next one in once it is running (one
engine step), any other once it is done (found by iterating the simulation until the arrivals settle).

Per request: simulated prompt time = first token - the slot's prompt start (the launch plus the
launch's own state copies, a RAM-cache load and the idle-slot saves, which come before the server's
`t_start_process_prompt`: the simulation's `prompt_s`), generation time = last token - first token,
the two quantities the engine's `prompt_ms` / `predicted_ms` measure. Printed: measured and simulated
milliseconds (medians over the rounds), the median over the rounds of their ratio, and the share of
requests within +-15 %, per trace and in all. The machine's
load average and the CPU that other processes took during the measurements are printed with them:
two llama.cpp threads on 2 vCPUs slow down many times over when anything else runs, so `--boost`
(root) runs this process at top CPU priority (nice -19, its own autogroup at -19), as
bench/engine_vs_server.py does.

`--max-other 0.2` keeps only rounds in which other processes used at most 0.2 cores (each round waits
for a quiet second first; a round that was busy all the same is discarded and another run, up to
`--max-rounds`).

    .venv/bin/python -m bench.sim_vs_measured [--repeats 9] [--boost] [--max-other CORES] [--trace NAME ...]
                                              [--json out.json]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.engine_vs_server import _machine_busy_s, boost, wait_idle

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "traces"
TRACES = ["defaults_chat_checkpoints", "multi_user_chat", "concurrent_deferred"]
COMMON = ["-t", "2", "--no-repack"]
BAR = 0.15


def measure_trace(model, name: str) -> tuple[list[dict], list]:
    """Replay a golden trace on the real engine; per request its timings and generated tokens, and the
    engine's steps as `slotlab.sim.speed.measure` records them."""
    from slotlab.engine.replay import load_trace, replay

    trace = load_trace(GOLDEN / f"{name}.json")
    steps: list = []
    out = replay_fresh(trace, model, steps)
    rows = []
    for r, t in zip(trace.requests, out["tasks"]):
        if t is None or t.error is not None:
            raise SystemExit(f"{name}: request {len(rows)} is an action or failed; pick traces of plain requests")
        tm = t.result["timings"]
        rows.append({"prompt_ms": tm["prompt_ms"], "predicted_ms": tm["predicted_ms"], "prompt_n": tm["prompt_n"],
                     "cache_n": tm["cache_n"], "predicted_n": tm["predicted_n"], "tokens": list(t.result["tokens"]),
                     "wait": r.get("wait", True)})
    return rows, steps


def replay_fresh(trace, model, steps: list | None = None) -> dict:
    """The trace on a new engine (cold slots, empty RAM cache), closed afterwards; its steps timed into
    `steps` as `slotlab.sim.speed.measure` records them."""
    from slotlab.engine.replay import replay
    from slotlab.engine.scheduler import Engine
    from slotlab.sim.speed import _Recorder

    eng = Engine([*trace.flags, *COMMON], model=model)
    if steps is not None:
        rec = _Recorder(eng)
        rec.on = True
        rec.steps = steps
    try:
        return replay(trace, engine=eng)
    finally:
        eng.close()


def simulate_trace(name: str, measured: list[dict], speed, vocab) -> list[dict]:
    """The trace on the paper memory with `speed`; the real answers scripted, replay's arrivals."""
    from slotlab.engine.replay import load_trace
    from slotlab.sim.simulate import simulate
    from slotlab.sim.traces import SimRequest, SimTrace

    trace = load_trace(GOLDEN / f"{name}.json")
    arrivals = [0.0] * len(trace.requests)
    for _ in range(20):  # arrivals depend on the simulated times: iterate to the fixed point
        reqs = []
        for r, m, a in zip(trace.requests, measured, arrivals):
            fields = {k: r[k] for k in ("id_slot", "cache_prompt", "n_cache_reuse", "message_delimiters") if k in r}
            reqs.append(SimRequest(a, -1, m["predicted_n"], prompt=r["prompt"],
                                   output=np.asarray(m["tokens"], np.int32), fields=fields))
        res = simulate(SimTrace(list(trace.flags), reqs), [*trace.flags, *COMMON], speed=speed, vocab=vocab,
                       fast=False)
        out = res.results
        nxt = [0.0]
        for r, d in zip(trace.requests, out[:-1]):
            # replay: "wait": false -> the next request once this one runs (the step that launched it);
            # otherwise once it is done
            # (a microsecond early: the results are rounded to microseconds, the step is far longer)
            nxt.append((d["arrival"] + d["ttft"] if r.get("wait", True) is False else d["end"]) - 1e-6)
        if np.allclose(nxt, arrivals, rtol=0, atol=1e-7):
            break
        arrivals = nxt
    rows = []
    for d in out:
        first = d["arrival"] + d["ttft"]
        rows.append({"prompt_ms": 1e3 * d["prompt_s"], "predicted_ms": 1e3 * (d["end"] - first),
                     "prompt_n": d["prompt_n"], "cache_n": d["cache_n"], "predicted_n": d["predicted_n"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_vs_measured", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9, help="interleaved rounds (calibration + every trace), default 9: "
                    "fewer let a slow phase of the host decide a median")
    ap.add_argument("--trace", action="append", help=f"golden trace name (repeatable; default {', '.join(TRACES)})")
    ap.add_argument("--boost", action="store_true", help="top CPU priority for this process (root)")
    ap.add_argument("--json", type=Path, help="write every sample and the comparison here")
    ap.add_argument("--max-other", type=float, help="discard (and rerun) a round in which other processes used more "
                                                     "than this many cores (default: keep every round)")
    ap.add_argument("--max-rounds", type=int, default=50, help="give up after this many rounds (default 50)")
    a = ap.parse_args(argv)
    from slotlab.llama import Model
    from slotlab.sim.speed import fit, measure, pool

    names = a.trace or TRACES
    print(f"uptime: {os.popen('uptime').read().strip()}")
    if a.boost:
        print("boost:", boost())
    model = Model()
    cal_rounds: list[dict] = []
    meas: dict[str, list[list[dict]]] = {n: [] for n in names}
    trace_steps: dict[str, list] = {n: [] for n in names}
    other = []
    k = 0
    while len(cal_rounds) < a.repeats:  # round 0 warms up (not counted)
        if k > a.max_rounds:
            raise SystemExit(f"only {len(cal_rounds)} of {a.repeats} rounds kept in {a.max_rounds} rounds: the "
                             f"machine stayed busy (--max-other {a.max_other})")
        if a.max_other is not None:  # wait (up to 10 minutes) for a second in which the rest is quiet
            wait_idle(600, a.max_other)
        b0, c0, t0 = _machine_busy_s(), time.process_time(), time.perf_counter()
        # the calibration brackets the traces, half before and half after: a host that speeds up or
        # slows down during the round (its phases last seconds to minutes) shifts both sides alike
        before = measure(model, n_threads=2, repeats=2)
        runs = {n: measure_trace(model, n) for n in names}
        pts = pool([before, measure(model, n_threads=2, repeats=2)])
        dt = time.perf_counter() - t0
        oth = max(0.0, _machine_busy_s() - b0 - (time.process_time() - c0)) / dt
        busy = a.max_other is not None and oth > a.max_other
        print(f"round {k}{' (warm-up)' if k == 0 else ''}: {dt:.1f} s, other processes used {oth:.2f} cores"
              f"{' - discarded' if busy and k else ''}", flush=True)
        k += 1
        if k == 1 or busy:
            continue
        other.append(oth)
        cal_rounds.append(pts)
        for n in names:
            meas[n].append(runs[n][0])
            trace_steps[n].append(runs[n][1])
    meas_all = pool(cal_rounds)
    src = "calibrated on the embedded model through slotlab's engine, -t 2"
    speeds = [fit(c, source=f"{src}, round {k + 1}") for k, c in enumerate(cal_rounds)]
    speed = fit(meas_all, source=f"{src}, all rounds")
    for label, sp in [*((f"round {k + 1}", x) for k, x in enumerate(speeds)), ("all rounds", speed)]:
        print(f"speed model, {label}: one token {1e3 * sp.decode_time(1):.2f} ms, two sequences "
              f"{1e3 * sp.decode_time(2, 2):.2f} ms, 512 tokens {1e3 * sp.decode_time(512):.1f} ms (t_decode "
              f"{1e3 * sp.t_decode:.2f} ms, no output -{1e3 * sp.t_first_output:.2f} ms, outputs "
              f"{[(k, round(1e3 * t, 2)) for k, t in sp.outputs]} ms, t_ctx {1e9 * sp.t_ctx:.0f} ns per token "
              f"and position, t_kv {1e9 * sp.t_kv:.0f} ns per sequence and position, t_byte "
              f"{1e12 * sp.t_byte:.0f} ps)")
    report = {"uptime": os.popen("uptime").read().strip(), "other_cores": other, "measurements": meas_all,
              "speed": json.loads(speed.to_json()), "speed_rounds": [json.loads(x.to_json()) for x in speeds],
              "traces": {}, "trace_steps": {}}
    all_p, all_g = [], []
    within = lambda xs: sum(1 for x in xs if abs(x - 1) <= BAR) / len(xs) if xs else float("nan")  # noqa: E731
    per_trace = {}
    for n in names:
        n_p, n_g = len(all_p), len(all_g)
        med = _median_requests(meas[n])
        # each round against its own calibration (the same machine state), then the median over rounds
        sims = [simulate_trace(n, runs, sp, model) for runs, sp in zip(meas[n], speeds)]
        print(f"\n{n}: per request, measured vs simulated ms (medians of {a.repeats} rounds; ratio: the median of "
              f"the rounds' ratios)")
        print(f"{'#':>3} {'prompt_n':>8} {'cache_n':>7} {'gen_n':>5} | {'prompt real':>11} {'sim':>8} {'ratio':>6} | "
              f"{'gen real':>9} {'sim':>8} {'ratio':>6}")
        rows = []
        for i, m in enumerate(med):
            s = sims[0][i]
            if (m["prompt_n"], m["cache_n"], m["predicted_n"]) != (s["prompt_n"], s["cache_n"], s["predicted_n"]):
                print(f"  request {i}: the simulation decided differently: real {m['prompt_n'], m['cache_n']}, "
                      f"simulated {s['prompt_n'], s['cache_n']}")
            sp_ms = statistics.median(x[i]["prompt_ms"] for x in sims)
            sg_ms = statistics.median(x[i]["predicted_ms"] for x in sims)
            rp = statistics.median(x[i]["prompt_ms"] / r[i]["prompt_ms"] for x, r in zip(sims, meas[n]))
            rg = (statistics.median(x[i]["predicted_ms"] / r[i]["predicted_ms"] for x, r in zip(sims, meas[n]))
                  if m["predicted_n"] > 1 else float("nan"))
            all_p.append(rp)
            if rg == rg:
                all_g.append(rg)
            print(f"{i:>3} {m['prompt_n']:>8} {m['cache_n']:>7} {m['predicted_n']:>5} | {m['prompt_ms']:>11.1f} "
                  f"{sp_ms:>8.1f} {rp:>6.2f} | {m['predicted_ms']:>9.1f} {sg_ms:>8.1f} {rg:>6.2f}")
            rows.append({"measured": m, "simulated": {**s, "prompt_ms": sp_ms, "predicted_ms": sg_ms},
                         "prompt_ratio": rp, "gen_ratio": rg,
                         "samples": [[x[i]["prompt_ms"], x[i]["predicted_ms"]] for x in meas[n]],
                         "sim_samples": [[x[i]["prompt_ms"], x[i]["predicted_ms"]] for x in sims]})
        report["traces"][n] = rows
        report["trace_steps"][n] = trace_steps[n]
        tp, tg = all_p[n_p:], all_g[n_g:]
        per_trace[n] = {"prompt": [sum(1 for x in tp if abs(x - 1) <= BAR), len(tp)],
                        "generation": [sum(1 for x in tg if abs(x - 1) <= BAR), len(tg)]}
        print(f"  within +-{BAR:.0%}: prompt {per_trace[n]['prompt'][0]} of {len(tp)}, generation "
              f"{per_trace[n]['generation'][0]} of {len(tg)}")
    print(f"\nwithin +-{BAR:.0%}: prompt {within(all_p):.0%} of {len(all_p)} requests (median ratio "
          f"{statistics.median(all_p):.2f}), generation {within(all_g):.0%} of {len(all_g)} (median ratio "
          f"{statistics.median(all_g):.2f})")
    print(f"uptime: {os.popen('uptime').read().strip()}; other processes: {min(other):.2f}-{max(other):.2f} cores")
    report["within"] = {"prompt": within(all_p), "generation": within(all_g), "per_trace": per_trace}
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=float) + "\n")
    return 0


def _median_requests(runs: list[list[dict]]) -> list[dict]:
    """Per request, the median times over the rounds (the decisions and tokens must agree)."""
    out = []
    for i, first in enumerate(runs[0]):
        for r in runs[1:]:
            same = (r[i]["prompt_n"], r[i]["cache_n"], r[i]["tokens"]) == (first["prompt_n"], first["cache_n"], first["tokens"])
            if not same:
                raise SystemExit(f"request {i}: the rounds disagree on the decisions or the tokens")
        out.append({**first, "prompt_ms": statistics.median(r[i]["prompt_ms"] for r in runs),
                    "predicted_ms": statistics.median(r[i]["predicted_ms"] for r in runs)})
    return out


if __name__ == "__main__":
    sys.exit(main())
