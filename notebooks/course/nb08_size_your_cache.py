"""Notebook 08-size-your-cache: its cells (markdown and code), written by `notebooks/build_notebooks.py 08-size-your-cache`."""

from course.cells import code, md

NAME = "08-size-your-cache"

CELLS = [
    md("""# 08 · Size your cache: conversation traffic on an 8B model, simulated

*How big should `--cache-ram` be, how many slots (`-np`), how many checkpoints (`--ctx-checkpoints`),
for my traffic and my model?* Answering that on the real server takes hours of GPU time per setting.
`slotlab.sim` answers it offline: the server's own slot, RAM-cache and checkpoint decisions run on a
**paper memory** (token ids and byte counts, no tensors, no model) on a simulated clock.

The traffic: the first 500 requests of the Mooncake **conversation** trace (Kimi's FAST'25 release,
Apache-2.0; the slice and its license are in `tests/sim/data/`): multi-turn chats whose prompts grow
turn by turn, 1k–120k tokens each. The model: **Llama 3.1 8B**, from its published hyperparameters
(`slotlab/sim/profiles/llama-3.1-8b.json`; `--profile model.gguf` reads any GGUF's header instead).
Every sweep goes through `slotlab.sim.whatif`, the same runs as
`slotlab whatif TRACE --profile llama-3.1-8b --vary "--cache-ram 0,8192,..."` on the command line."""),
    code("""from pathlib import Path
from slotlab.memory.profile import ModelProfile

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "slotlab" / "sim" / "profiles").exists())
PROFILE = ROOT / "slotlab" / "sim" / "profiles" / "llama-3.1-8b.json"
prof = ModelProfile.from_json(PROFILE)
n_kv_heads, head_dim = prof.n_head_kv[0], prof.n_embd_head_k
kv = prof.n_layer * n_kv_heads * head_dim * 2 * 2      # layers x KV heads x head dim x (K and V) x 2 bytes (f16)
print(f"{prof.name}: {prof.n_layer} layers x {n_kv_heads} KV heads x {head_dim} dims x 2 (K, V) x 2 bytes")
print(f"  = {kv:,} bytes = {kv // 1024} KiB of KV cache per token")
assert kv == prof.bytes_per_token() == 128 * 1024       # what the paper memory sizes every state blob with
for mib in (8192, 32768, 131072, 262144):
    print(f"  --cache-ram {mib:>6} holds {mib * 2**20 // kv:>9,} tokens")"""),
    md("""128 KiB a token: a 14k-token conversation is 1.75 GiB of state, so the default `--cache-ram 8192`
keeps about four of them. The trace's arrivals are a whole cluster's traffic, so we stretch them 16×
(`time_scale`) to give one server a share it can keep up with, at an assumed 8000 prompt tokens/s and
60 tokens/s of generation (put your GPU's figures here, or `slotlab calibrate`'s). The
**infinite-cache bound** is what a cache that kept every prefix ever seen could reuse (the trace's
`hash_ids`: equal ids are equal 512-token blocks); no setting can beat it."""),
    code("""from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import infinite_cache_bound, load_mooncake

TRACE = ROOT / "tests" / "sim" / "data" / "mooncake_conversation_first500.jsonl"
TIME_SCALE = 16
SPEED = SpeedModel.from_rates(8000, 60)
trace = load_mooncake(TRACE, time_scale=TIME_SCALE)
lens = sorted(r.n_prompt for r in trace.requests)
bound, total = infinite_cache_bound(trace)
print(f"{len(lens)} requests over {trace.requests[-1].arrival:.0f} simulated seconds; {total:,} prompt tokens "
      f"(median {lens[len(lens) // 2]:,}, max {lens[-1]:,}), {sum(r.n_predict for r in trace.requests):,} to generate")
print(f"infinite-cache bound: {bound:,} tokens reusable = {100 * bound / total:.1f} % of the prompt tokens")
assert total == sum(lens) and 0 < bound < total"""),
    md("""## Sweep 1: `--cache-ram`

The GPU holds the slots' KV: `-c 262144 -kvu` is one unified pool of 262,144 tokens (32 GiB) shared by
the 4 slots, so a 120k-token conversation fits. The RAM cache sits behind it in host memory."""),
    code("""from slotlab.sim.whatif import run_grid

BASE = ["-c", "262144", "-kvu", "-np", "4"]

def sweep(base, flag, values):
    return run_grid(TRACE, base, [(flag, values)], speed=SPEED, profile=str(PROFILE), time_scale=TIME_SCALE, jobs=2)

def show(runs, tag="", labels=None):
    for r, label in zip(runs, labels or [tag + r.label for r in runs]):
        print(f"{label:48s} reused {100 * r.reuse:5.2f} % ({100 * r.of_bound:4.1f} % of the bound), prefilled "
              f"{r.tokens_prefilled:>9,}, peak RAM cache {r.peak_cache_bytes / 2**30:5.1f} GiB, TTFT p50 "
              f"{r.ttft_p50:6.2f} s p99 {r.ttft_p99:6.2f} s, errors {r.n_errors}")

ram = sweep(BASE, "--cache-ram", ["0", "8192", "32768", "131072", "262144", "-1"])
show(ram)
by_ram = {r.setting["--cache-ram"]: r for r in ram}
assert all(r.error is None and r.n_errors == 0 and r.tokens_reused <= r.bound_tokens for r in ram)  # never above the bound
sizes = ["8192", "32768", "131072", "262144"]
assert all(by_ram[a].tokens_reused <= by_ram[b].tokens_reused for a, b in zip(sizes, sizes[1:]))  # more RAM, more reuse
assert by_ram["8192"].tokens_reused < by_ram["32768"].tokens_reused < by_ram["0"].tokens_reused  # ... but a small cache loses
assert by_ram["-1"].tokens_prefilled == by_ram["32768"].tokens_prefilled   # -1 is not unlimited here"""),
    md("""Three things to read here.

* **More RAM never lowers reuse** once the cache is on: 8 → 32 → 128 → 256 GiB reuse more and more,
  and 256 GiB gets the most. Still well under the bound: the cache evicts its oldest entries first,
  an entry comes back only when the new prompt keeps at least a quarter of it (`f_keep` ≥ 0.25: an
  opening 512-token block shared with another conversation is below that floor), and the bound also
  counts prefixes that no slot or entry holds any more.
* **Turning a small cache on lowers reuse** below no cache at all. With a RAM cache and a unified pool
  llama-server saves every idle slot to the cache *and clears it* when a new task starts
  (`--cache-idle-slots`, on by default; docs/server-behaviour.md 1.6). A conversation between turns
  then lives only in the cache, and a cache that holds four of them evicts it (`make_room`) before its
  next turn, where without a cache it would still sit in its slot. The next cell proves it: the same
  8 GiB cache with `--no-cache-idle-slots` makes exactly the no-cache decisions.
* **`--cache-ram -1`** means no *byte* limit, not an infinite cache: the server still caps the cache
  at the context's token count (`-c`, 262,144 tokens = 32 GiB here: the `token_limit` evictions), so
  it behaves exactly as 32 GiB."""),
    code("""idle = sweep(BASE + ["--no-cache-idle-slots"], "--cache-ram", sizes)
show(idle, "--no-cache-idle-slots ")
print("--cache-ram -1 evictions:", by_ram["-1"].extra["evictions"])
by_idle = {r.setting["--cache-ram"]: r for r in idle}
assert by_idle["8192"].tokens_prefilled == by_ram["0"].tokens_prefilled    # the loss above is the idle-slot saves
assert all(by_idle[s].tokens_reused >= max(by_ram["0"].tokens_reused, by_ram[s].tokens_reused) for s in sizes)
assert all(by_idle[a].tokens_reused <= by_idle[b].tokens_reused for a, b in zip(sizes, sizes[1:]))
assert "token_limit" in by_ram["-1"].extra["evictions"]"""),
    code("""import json
import plotly.graph_objects as go
from IPython.display import display

def show_fig(fig, head, rows):
    \"\"\"The plotly figure, with the same numbers as an HTML table for viewers that run no JavaScript.\"\"\"
    html = "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    display({"application/vnd.plotly.v1+json": json.loads(fig.to_json()), "text/html": html,
             "text/plain": f"<figure: {fig.layout.title.text}>"}, raw=True)

pct = lambda r: round(100 * r.reuse, 2)
fig = go.Figure([go.Scatter(x=sizes, y=[pct(by_ram[s]) for s in sizes], mode="lines+markers", name="idle slots cached (default)"),
                 go.Scatter(x=sizes, y=[pct(by_idle[s]) for s in sizes], mode="lines+markers", name="--no-cache-idle-slots"),
                 go.Scatter(x=sizes, y=[pct(by_ram["0"])] * len(sizes), mode="lines", name="--cache-ram 0",
                            line=dict(dash="dot", color="black")),
                 go.Scatter(x=sizes, y=[round(100 * bound / total, 2)] * len(sizes), mode="lines",
                            name="infinite-cache bound", line=dict(dash="dash", color="gray"))])
fig.update_layout(title="prompt tokens reused (%) vs --cache-ram (MiB), Llama 3.1 8B, -np 4 -kvu -c 262144",
                  xaxis_type="category", yaxis_title="% of prompt tokens", height=380)
show_fig(fig, ["--cache-ram", "reused (default)", "reused (--no-cache-idle-slots)", "no cache", "bound"],
         [(s, pct(by_ram[s]), pct(by_idle[s]), pct(by_ram["0"]), round(100 * bound / total, 2)) for s in sizes])"""),
    md("""## Sweep 2: `-np`

Slots trade queueing against memory: all slots share the 262,144-token pool."""),
    code("""slots = sweep(BASE[:-2] + ["--cache-ram", "131072", "--no-cache-idle-slots"], "-np", ["1", "2", "8"])
slots.insert(2, by_idle["131072"])
nps = [r.flags[r.flags.index("-np") + 1] for r in slots]
show(slots, labels=[f"--cache-ram 131072 --no-cache-idle-slots -np {n}" for n in nps])
assert nps == ["1", "2", "4", "8"]
assert all(a.ttft_p50 > b.ttft_p50 for a, b in zip(slots, slots[1:]))   # more slots, less queueing
assert slots[3].n_errors > 0 == slots[0].n_errors + slots[1].n_errors + slots[2].n_errors
fig = go.Figure([go.Bar(x=nps, y=[r.ttft_p50 for r in slots], name="TTFT p50 (s)"),
                 go.Scatter(x=nps, y=[r.ttft_p99 for r in slots], mode="markers", name="TTFT p99 (s)",
                            marker=dict(symbol="diamond", color="black"))])
fig.update_layout(title="time to first token vs -np (--cache-ram 131072 --no-cache-idle-slots)", xaxis_type="category",
                  yaxis_type="log", yaxis_title="seconds", height=360)
show_fig(fig, ["-np", "TTFT p50 (s)", "TTFT p99 (s)", "reused", "errors"],
         [(n, round(r.ttft_p50, 2), round(r.ttft_p99, 2), f"{pct(r)} %", r.n_errors) for n, r in zip(nps, slots)])"""),
    md("""One slot queues everyone behind a 120k-token prefill (TTFT in minutes); each doubling cuts the
wait. Eight slots answer fastest but **fail requests**: eight conversations of tens of thousands of
tokens no longer fit the shared 262,144-token pool, and the server answers "Context size has been
exceeded" for some. Eight slots would need a bigger `-c` (more GPU memory: 128 KiB a token)."""),
    md("""## Sweep 3: `--ctx-checkpoints`"""),
    code("""ckpt = sweep(BASE + ["--cache-ram", "8192"], "--ctx-checkpoints", ["0", "32"])
show(ckpt)
assert all(r.tokens_prefilled == by_ram["8192"].tokens_prefilled and r.ttft_p50 == by_ram["8192"].ttft_p50
           for r in ckpt)   # 0, the default 8 and 32: the same decisions"""),
    md("""No difference at all, and that is the answer for this model: Llama 3.1 is full attention, so the
server can cut a slot back to any position and never needs a context checkpoint (it makes them only
for sliding-window, hybrid and recurrent models, where a cut-back needs one: notebooks 06 and 09).
For Gemma 3 or Qwen3.5, sweep it."""),
    md("""## The setting to run

Among the settings above that served every request and kept the RAM cache within 128 GiB of host
memory, the one with the lowest median time to first token:"""),
    code("""from slotlab.sim.whatif import best

BUDGET_MIB = 131072
pick = best([r for r in ram + idle + slots if r.n_errors == 0], BUDGET_MIB, "ttft_p50")
print("llama-server", " ".join(pick.flags))
show([pick])
assert pick.flags == BASE + ["--no-cache-idle-slots", "--cache-ram", "131072"]
assert pick.peak_cache_bytes <= BUDGET_MIB * 2**20 and pick.n_errors == 0
assert pick.tokens_reused > by_ram["131072"].tokens_reused > by_ram["0"].tokens_reused
assert pick.ttft_p50 < min(r.ttft_p50 for r in ram if r.peak_cache_bytes <= BUDGET_MIB * 2**20)"""),
    md("""`-np 4 -kvu -c 262144 --cache-ram 131072 --no-cache-idle-slots`: idle conversations stay in their
slots, and 128 GiB of RAM keeps the ones the slots had to give up. Even so this trace's first 500
requests leave most of the bound on the table: their conversations come back minutes later with
prompts that outgrow what 4 slots and 128 GiB hold; the whole day's trace (12,031 requests, in
`../shared/data/mooncake/` beside a checkout) answers better for a production server.

## Try this
1. Your traffic: `slotlab whatif my-sessions.jsonl --vary "--cache-ram 0,8192,65536"` reads an
   OpenAI-messages session log (one line a call: `session_id`, `messages`, `output_length`, `gap`).
2. Eight slots without the errors: `--vary "-c 262144,524288"` with `-np 8` (and check the GPU has
   the 64 GiB of KV that 524,288 tokens take).
3. A model with a sliding window (`--profile gemma-3.gguf`): now `--ctx-checkpoints` matters."""),
]
