"""Notebook 13-time-and-servers: its cells (markdown and code), written by `notebooks/build_notebooks.py 13-time-and-servers`."""

from course.cells import code, md

NAME = "13-time-and-servers"

CELLS = [
    md("""# 13 · Seconds, pools and servers: what a prompt costs on your GPU, one KV pool or four, one server or many

The chapters before counted tokens: reused, re-processed, held. A user waits in seconds, and the
seconds depend on the model and the GPU. This chapter turns tokens into time and then asks the two
questions that time raises: how the KV memory of one server is shared between its slots
(`--kv-unified`, `--kv-unified-per-slot`), and when one server is not enough, how many, behind which
router.

Every number here is on paper (no model is loaded): the paper memory sizes each profile's KV exactly,
and the step times come from **speed estimates per profile and GPU class** (`slotlab.sim.gpus`):
generation fitted to llama.cpp's measured tokens/s on each GPU class, prefill from llama.cpp's measured
micro-batch curve on an RTX 4090, scaled by the model's active parameters and the GPU's tensor rate,
attention deep in a context from the model's heads. They are estimates and say so; `slotlab calibrate
--url http://your-server:8080` measures your own server and writes a speed model that replaces them
(`--speed FILE` wherever `--gpu` goes)."""),
    code("""from pathlib import Path
from slotlab.sim import gpus
from slotlab.sim.cli import resolve_profile, speed_rows

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "slotlab" / "sim" / "profiles").exists())
MODELS = ["llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-27b", "qwen3.5-27b", "llama-3.3-70b"]
CLASSES = ["rtx-4090", "a100-sxm-80g", "h100-sxm"]

def prompt_seconds(speed, n, chunk=2048):
    \"\"\"A prompt of n tokens from position 0, decoded in the server's n_batch chunks, the last with its logits.\"\"\"
    t, p = 0.0, 0
    while p < n:
        c = min(chunk, n - p)
        t += speed.decode_time(c, 1 if p + c == n else 0, c * p, p)
        p += c
    return t

rows = {r["profile"]: r for r in speed_rows(MODELS)}
secs = {}
for m in MODELS:
    for g in CLASSES:
        if rows[m]["gpus"][g]["fits"]:
            sp = gpus.speed_for(resolve_profile(m), g)
            secs[m, g] = (prompt_seconds(sp, 4096), prompt_seconds(sp, 32768), sp.gen_rate(1))
print(f"{'profile':15s} {'GPU':13s} {'4k prompt':>10s} {'32k prompt':>11s} {'generation':>11s}")
for (m, g), (a, b, c) in secs.items():
    print(f"{m:15s} {g:13s} {a:9.2f} s {b:10.2f} s {c:7.1f} tok/s")
# not asserted: the whole table; the figures the prose cites are asserted below
r = lambda k, i, d=2: round(secs[k][i], d)  # noqa: E731
assert (r(("llama-3.1-8b", "rtx-4090"), 1), r(("gemma-3-27b", "rtx-4090"), 1), r(("gemma-3-27b", "h100-sxm"), 1)) == (5.12, 12.36, 8.18)
assert r(("llama-3.3-70b", "h100-sxm"), 1) == 25.61 and ("llama-3.3-70b", "rtx-4090") not in secs
assert r(("qwen3-30b-a3b", "rtx-4090"), 1) == 5.18 and r(("qwen3-30b-a3b", "rtx-4090"), 2, 1) == 169.9
assert r(("gemma-3-27b", "rtx-4090"), 2, 1) == 43.1 and r(("gemma-3-27b", "rtx-4090"), 0) == 1.49
assert [rows[m]["default_gpu"] for m in MODELS] == ["rtx-4080", "rtx-4090", "rtx-4090", "rtx-4090", "h100-sxm"]
assert round(rows["llama-3.3-70b"]["weights_gib"], 1) == 40.3"""),
    md("""## Seconds, not tokens

A 32,768-token prompt (an agent's context after an hour of tool calls) takes **5.12 s** to prefill on
an RTX 4090 with Llama 3.1 8B and **12.36 s** with Gemma 3 27B; an H100 brings the 27B down to
**8.18 s**. Llama 3.3 70B (40.3 GiB at Q4_K_M) does not fit a 24 GB card at all and takes **25.61 s**
on an H100. Read a reuse figure from the earlier chapters with these in mind: re-processing a 32k
conversation at 27B on one 4090 is twelve seconds before the first token, every time.

Two things the table shows that a tokens/s figure hides:

* **A prompt gets slower the deeper it goes.** The 27B's 4k prompt takes 1.49 s, its 32k one more than
  eight times that: every new token attends to all the positions before it (Gemma 3's sliding-window
  layers stop growing at their window; its full-attention layers do not).
* **An MoE prefills like its active part and generates faster than its size.** Qwen3 30B-A3B (3.3 B
  active of 30.5 B) prefills 32k in 5.18 s, as fast as the 8B, and generates 169.9 tokens/s against the
  27B's 43.1. The RAM cache and the slot, though, hold its KV like any 30B model's.

`slotlab simulate` uses these when you give a profile and no speed: the smallest GPU class that holds
the weights (`--gpu` to choose; `slotlab profiles --speed` prints the whole table with its sources), and
says on stderr which one it took."""),
    code("""import matplotlib.pyplot as plt
from slotlab.figures import png

fig, ax = png.new(9, 3.2)
w = 0.26
colors = {"rtx-4090": "#1f77b4", "a100-sxm-80g": "#ff7f0e", "h100-sxm": "#2ca02c"}
for j, g in enumerate(CLASSES):
    xs = [i + (j - 1) * w for i, m in enumerate(MODELS) if (m, g) in secs]
    ys = [secs[m, g][1] for m in MODELS if (m, g) in secs]
    bars = ax.bar(xs, ys, width=w, color=colors[g], label=gpus.GPUS[g].label)
    ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
for i, m in enumerate(MODELS):
    for j, g in enumerate(CLASSES):
        if (m, g) not in secs:
            ax.text(i + (j - 1) * w, 0.5, "does not fit", rotation=90, ha="center", va="bottom", fontsize=7, color="#777")
ax.set_xticks(range(len(MODELS)), MODELS)
ax.set_ylabel("seconds")
ax.set_title("Prefill of a 32,768-token prompt from an empty slot (estimated, Q4_K_M, one GPU)", loc="left")
ax.legend(frameon=False, fontsize=8)
png.image(fig)"""),
    md("""## One KV pool or four: `--kv-unified` and `--kv-unified-per-slot`

`-np 4 -c 65536` gives each of the four slots its own 16,384 cells. With `--kv-unified` (`-kvu`, also
what an unset `-np` turns on) the four slots share one pool of 65,536 cells: any slot may grow to the
whole pool, as long as the others leave room. That is what an agent needs beside short chats, and
it moves the failure: a split pool refuses a long prompt up front with a 400 (*exceeds the available
context size*), a shared pool fails when a decode finds no free cell. The server then clears an idle
slot if it has one (with the default `--cache-idle-slots` they are usually empty already), halves the
batch down to one token, and at one token gives up with a 500, *Context size has been exceeded.*, for
**every slot that was processing** at that moment, not only the one that grew.

`--kv-unified-per-slot N` caps each slot at N cells in a shared pool (and without `-c` sizes the pool
to `-np` × N). Both behaviours are recorded from the real server in `tests/golden/traces/
kv_unified_pool_full` and `kv_unified_per_slot`, which slotlab replays exactly.

The traffic below: an agent whose context starts at 6,000 tokens and grows by 5,200 a turn for nine
turns (to 47,600), and beside each turn three unrelated 3,000-token chats. Llama 3.1 8B on paper, an
RTX 4090's speed."""),
    code("""import numpy as np
from slotlab.sim.simulate import simulate
from slotlab.sim.traces import SimRequest, SimTrace

P8 = resolve_profile("llama-3.1-8b")
SP8 = gpus.speed_for(P8, "rtx-4090")
rng = np.random.default_rng(0)
reqs, agent, t = [], rng.integers(10, 100000, 6000).astype(np.int32), 0.0
for turn in range(9):
    out = rng.integers(10, 100000, 200).astype(np.int32)
    reqs.append(SimRequest(t, len(agent), 200, prompt=agent.copy(), output=out))  # the agent: request 0, 4, 8, ...
    agent = np.concatenate([agent, out, rng.integers(10, 100000, 5000).astype(np.int32)])
    for k in range(3):
        reqs.append(SimRequest(t + 0.5 + k, 3000, 300, prompt=rng.integers(10, 100000, 3000).astype(np.int32)))
    t += 30.0
day = SimTrace([], reqs)
SETUPS = {"four pools": "-np 4 -c 65536", "one pool": "-np 4 -kvu -c 65536",
          "one pool, capped": "-np 4 -kvu -c 65536 --kv-unified-per-slot 32768",
          "a smaller pool": "-np 4 -kvu -c 49152", "a smaller pool, capped": "-np 4 -kvu -c 49152 --kv-unified-per-slot 32768"}
pools = {}
for name, flags in SETUPS.items():
    res = simulate(day, flags, speed=SP8, profile=P8)
    ag = [r for i, r in enumerate(res.results) if i % 4 == 0]
    ch = [r for i, r in enumerate(res.results) if i % 4]
    pools[name] = {"agent": sum(r["status"] == 200 for r in ag), "chats": sum(r["status"] == 200 for r in ch),
                   "reused": res.totals["tokens_reused"], "codes": sorted({r["status"] for r in res.results})}
    p = pools[name]
    print(f"{name:23s} {flags:50s} agent turns {p['agent']}/9, chats {p['chats']}/27, "
          f"reused {p['reused']:,} tokens, statuses {p['codes']}")
assert [pools[n]["agent"] for n in SETUPS] == [2, 9, 6, 7, 6] and [pools[n]["chats"] for n in SETUPS] == [27, 27, 27, 21, 27]
assert [pools[n]["reused"] for n in SETUPS] == [6199, 195192, 82995, 115194, 82995]
assert pools["a smaller pool"]["codes"] == [200, 500] and pools["four pools"]["codes"] == [200, 400]
assert len(day.requests) == 36 and len(agent) - 5200 == 47600
assert SETUPS["a smaller pool, capped"] == "-np 4 -kvu -c 49152 --kv-unified-per-slot 32768" and SETUPS["one pool"].endswith("-c 65536")"""),
    md("""* **Four pools** refuse the agent from its third turn on (16,400 tokens > 16,384 a slot): 2 of 9 turns
  served, and 6,199 tokens reused in the whole day.
* **One pool** serves everything: the agent grows to 47,600 tokens while the chats take what is left,
  and reuses 195,192 tokens, because each turn finds its conversation still in its slot.
* **A smaller pool** (49,152) is where sharing bites: when the agent's context and three chats no longer
  fit together, a decode finds no free cell, and the 500 takes down the chats that were processing with
  it: 6 of 27 chats lost (status 500), and 2 agent turns.
* **Capped at 32,768** (`--kv-unified-per-slot 32768`), the same smaller pool serves every chat: the cap
  refuses the agent's last three turns with a clear 400 instead, before they can fill the pool. The cap
  is the choice between a long conversation failing alone and everybody failing sometimes.

The rule behind the numbers: in a shared pool the sum of what the slots hold must fit; `--kv-unified-per-slot`
bounds each term of the sum. Size the pool for the longest conversation plus what the others hold at
once, or cap the slots."""),
    md("""## One server or many, and which router

Past some traffic, one server cannot keep up however its cache is tuned. The Mooncake conversation
trace (12,031 requests in one hour, 97 million prompt tokens) on Gemma 3 27B and one RTX 4090 is such a
case: prefill alone asks for about 27,000 tokens/s, and the card does about 2,800. `slotlab simulate
TRACE --fleet N --router R` runs N servers on paper, each making exactly its build's decisions, behind a
router that sees what a real one sees (`round-robin`; `least-loaded`, the requests in flight it sent
each server; `session`, a conversation key; `prefix`, its own index of the blocks it sent where); the
fleet goldens (`tests/golden/traces_fleet/`) check the per-server decisions against real llama-servers
behind a real router.

`slotlab whatif` runs the grid: fleet sizes, routers, and the smallest fleet that meets a TTFT target."""),
    code("""from slotlab.sim.whatif import run_grid, smallest_fleet

TRACE = ROOT / "tests" / "sim" / "data" / "mooncake_conversation_trace.jsonl"  # the whole trace
SP27 = gpus.speed_for(resolve_profile("gemma-3-27b"), "rtx-4090")
BASE = ["-np", "4", "--cache-ram", "8192"]
one = run_grid(str(TRACE), BASE, [("--fleet", ["1"])], speed=SP27, profile="gemma-3-27b", jobs=1)
fleets = run_grid(str(TRACE), BASE, [("--fleet", ["16", "24"]), ("--router", ["round-robin", "session", "prefix"])],
                  speed=SP27, profile="gemma-3-27b", jobs=2)
runs = one + fleets
for r in runs:
    print(f"{r.label:38s} reused {100 * r.reuse:5.2f} %   TTFT p50 {r.ttft_p50:9.1f} s   p99 {r.ttft_p99:9.1f} s")
pick, pick120 = smallest_fleet(runs, 60.0), smallest_fleet(runs, 120.0)
print("the smallest fleet with TTFT p99 <= 60 s:", pick.label, "| <= 120 s:", pick120.label)
import json
span = json.loads(TRACE.read_text().splitlines()[-1])["timestamp"] / 1000
demand = one[0].prompt_tokens / span
print(f"{one[0].n_requests:,} requests, {one[0].prompt_tokens / 1e6:.0f} million prompt tokens in {span:,.0f} s: "
      f"{demand:,.0f} prompt tokens/s asked, one server prefills {SP27.prefill_rate(2048):,.0f}")
too_long = sum(n for k, n in one[0].extra["errors"].items() if "exceeds the available context size (32768 tokens)" in k)
print(f"refused in every run: {one[0].n_errors} requests longer than a slot's 32,768 tokens "
      "(-np 4 splits Gemma 3 27B's 131,072)")
by = {r.label: r for r in runs}
pct = lambda k: round(100 * by[k].reuse, 2)  # noqa: E731
p99 = lambda k: round(by[k].ttft_p99, 1)  # noqa: E731
assert (one[0].n_requests, round(one[0].prompt_tokens / 1e6), round(span), round(demand), round(SP27.prefill_rate(2048))) == (12031, 97, 3537, 27441, 2761)
assert round(one[0].ttft_p50, 1) == 27943.4 and round(one[0].ttft_p99, 1) == 53915.4 and pct("--fleet 1") == 5.52
assert [pct(f"--fleet 24 --router {r}") for r in ("round-robin", "session", "prefix")] == [4.51, 7.73, 7.08]
assert [p99(f"--fleet 24 --router {r}") for r in ("round-robin", "session", "prefix")] == [20.8, 73.5, 61.4]
assert [p99(f"--fleet 16 --router {r}") for r in ("round-robin", "session", "prefix")] == [375.2, 540.7, 874.2]
assert [pct(f"--fleet 16 --router {r}") for r in ("round-robin", "session", "prefix")] == [5.05, 6.26, 5.37]
assert (pick.label, pick120.label) == ("--fleet 24 --router round-robin", "--fleet 24 --router session")
assert round(by["--fleet 24 --router round-robin"].ttft_p50, 1) == 2.9
assert too_long == one[0].n_errors == 829 and all(r.n_errors == 829 for r in runs) and 4 * 32768 == 131072
assert pick.ttft_p99 <= 60 and pick120.ttft_p99 <= 120 < by["--fleet 16 --router round-robin"].ttft_p99"""),
    md("""One server answers its median request after **27,943.4 s** (almost eight hours): 12,031 requests ask for
27,441 prompt tokens a second and one RTX 4090 prefills 2,761. Sixteen servers still fall behind (TTFT
p99 375.2 s at best); 24 keep up, and there the router decides the rest:

* **Round-robin balances best and reuses least**: TTFT p99 **20.8 s**, 4.51 % of the prompt reused, less
  than one server's 5.52 %, because a conversation's next turn lands on a server that never saw it.
* **Session affinity reuses most** (**7.73 %**: each conversation returns to the server that holds it, and
  24 RAM caches of 8 GiB hold far more conversations than one) but loads servers unevenly: the servers
  that drew the busy conversations queue, TTFT p99 73.5 s.
* **Prefix-aware** sits between them (7.08 %, p99 61.4 s): it follows the blocks it routed, so it also
  sends unrelated requests that share the opening block to the same server.

So the answer depends on what you promise: with a TTFT p99 of 60 s, the smallest fleet is 24 servers
behind round-robin; with 120 s, the same 24 behind session affinity, for half again as much reuse.
Fewer servers are not an option at 27B on this traffic, whatever the router (at 16, every router's p99
is past six minutes: 375.2 s, 540.7 s, 874.2 s). And in every run the same 829 requests are refused
outright: longer than a slot's 32,768 tokens (`-np 4` splits the 131,072-token context). A fleet does
not fix that; `-kvu` or a larger `-c` per slot does (the pool section above)."""),
    code("""from slotlab.figures.whatif import fleet_sweep

png.image(fleet_sweep(runs, ttft_target=60.0, pick=pick,
                      title="Gemma 3 27B on RTX 4090s, the Mooncake conversation trace: reuse and TTFT p99 against servers"))"""),
    md("""## Try this
1. Your GPU: `slotlab simulate TRACE --profile gemma-3-27b --gpu h100-sxm` against `--gpu rtx-4090`; then
   measure your own server with `slotlab calibrate --url http://HOST:PORT -o mine.json` and pass
   `--speed mine.json`. How far off was the estimate?
2. The pool: give the agent above a 64k pool with `--kv-unified-per-slot 49152`. Who fails now?
3. The fleet: `slotlab simulate TRACE --fleet 16 --router session --png lanes.png` draws each server's
   slots and requests; in JupyterLab, `FleetView(res)` (`slotlab.panel.fleet`) lists why each request
   went where it went."""),
]
