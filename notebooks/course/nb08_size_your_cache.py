"""Notebook 08-size-your-cache: its cells (markdown and code), written by `notebooks/build_notebooks.py 08-size-your-cache`."""

from course.cells import code, md

NAME = "08-size-your-cache"

CELLS = [
    md("""# 08 · Size your cache: conversation traffic on an 8B model, checkpoints on 27B models, simulated

*How big should `--cache-ram` be, how many slots (`-np`), how many checkpoints (`--ctx-checkpoints`),
for my traffic and my model?* Answering that on the real server takes hours of GPU time per setting.
`slotlab.sim` answers it offline: the server's own slot, RAM-cache and checkpoint decisions run on a
**paper memory** (token ids and byte counts, no tensors, no model) on a simulated clock.

The traffic: the first 500 requests of the Mooncake **conversation** trace (Kimi's FAST'25 release,
Apache-2.0; the slice and its license are in `tests/sim/data/`): multi-turn chats whose prompts grow
turn by turn, from under a thousand to 121,298 tokens. The model: **Llama 3.1 8B**, from its published
hyperparameters (`slotlab/sim/profiles/llama-3.1-8b.json`; `--profile model.gguf` reads any GGUF's
header instead). Every sweep goes through `slotlab.sim.whatif`, the same runs as
`slotlab whatif TRACE --profile llama-3.1-8b --vary "--cache-ram 0,8192,..."` on the command line, and
every picture is drawn by `slotlab.figures.whatif` from those runs' results.

Llama 3.1 is full attention and never makes a context checkpoint. The last part of the chapter runs
a chat on **Gemma 3 27B** (sliding window) and **Qwen3.5 27B** (hybrid: recurrent layers), where every
RAM-cache entry carries its slot's checkpoints, and shows what happens when they no longer fit in
`--cache-ram`."""),
    code("""from pathlib import Path
from slotlab.memory.profile import ModelProfile

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents]
            if (p / "slotlab" / "sim" / "profiles").exists())
PROFILE = ROOT / "slotlab" / "sim" / "profiles" / "llama-3.1-8b.json"
prof = ModelProfile.from_json(PROFILE)
n_kv_heads, head_dim = prof.n_head_kv[0], prof.n_embd_head_k
# layers x KV heads x head dim x (K and V) x 2 bytes (f16)
kv = prof.n_layer * n_kv_heads * head_dim * 2 * 2
print(f"{prof.name}: {prof.n_layer} layers x {n_kv_heads} KV heads x {head_dim} dims x 2 (K, V) x "
      f"2 bytes")
print(f"  = {kv:,} bytes = {kv // 1024} KiB of KV cache per token")
holds = {mib: mib * 2**20 // kv for mib in (8192, 32768, 131072, 262144)}
for mib, n in holds.items():
    print(f"  --cache-ram {mib:>6} holds {n:>9,} tokens")
assert prof.name.startswith("Llama 3.1 8B") and (prof.n_layer, n_kv_heads, head_dim) == (32, 8, 128)
# the formula is what the paper memory sizes every state blob with
assert kv == prof.bytes_per_token() == 131_072
assert kv // 1024 == 128 and kv % 1024 == 0
# 8, 32, 128, 256 GiB
assert holds == {8192: 65_536, 32768: 262_144, 131072: 1_048_576, 262144: 2_097_152}"""),
    md("""128 KiB a token: the default `--cache-ram 8192` (8 GiB) holds 65,536 tokens of state, 32 GiB hold
262,144. The trace's arrivals are a whole cluster's traffic, so we stretch them 16×
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
mean = total // len(lens)
print(f"{len(lens)} requests over {trace.requests[-1].arrival:.0f} simulated seconds; {total:,} "
      f"prompt tokens "
      f"(min {lens[0]:,}, median {lens[len(lens) // 2]:,}, mean {mean:,}, max {lens[-1]:,}), "
      f"{sum(r.n_predict for r in trace.requests):,} to generate")
print(f"a mean prompt is {mean * kv / 2**30:.2f} GiB of KV state: --cache-ram 8192 holds "
      f"{8192 * 2**20 // (mean * kv)} of them")
print(f"infinite-cache bound: {bound:,} tokens reusable = {100 * bound / total:.1f} % of the "
      f"prompt tokens")
assert (total == sum(lens) == 7_124_855 and len(lens) == 500
        and round(trace.requests[-1].arrival) == 2640)
assert (lens[0], lens[len(lens) // 2], mean, lens[-1]) == (892, 8_974, 14_249, 121_298)
assert sum(r.n_predict for r in trace.requests) == 180_942
assert round(mean * kv / 2**30, 2) == 1.74 and 8192 * 2**20 // (mean * kv) == 4
assert bound == 1_167_589 and round(100 * bound / total, 1) == 16.4 and 0 < bound < total"""),
    md("""The mean prompt, 14,249 tokens, is 1.74 GiB of state, so the default `--cache-ram 8192` keeps four
of them; no setting can reuse more than 16.4 % of this trace's prompt tokens.

## Sweep 1: `--cache-ram`

The GPU holds the slots' KV: `-c 262144 -kvu` is one unified pool of 262,144 tokens (32 GiB) shared by
the 4 slots, so a 121,298-token conversation fits. The RAM cache sits behind it in host memory."""),
    code("""from slotlab.sim.whatif import run_grid

BASE = ["-c", "262144", "-kvu", "-np", "4"]

def sweep(base, flag, values):
    return run_grid(TRACE, base, [(flag, values)], speed=SPEED, profile=str(PROFILE),
                    time_scale=TIME_SCALE, jobs=2)

def show(runs, tag="", labels=None):
    for r, label in zip(runs, labels or [tag + r.label for r in runs]):
        print(f"{label:48s} reused {100 * r.reuse:5.2f} % ({100 * r.of_bound:4.1f} % of the "
              f"bound), prefilled "
              f"{r.tokens_prefilled:>9,}, peak RAM cache {r.peak_cache_bytes / 2**30:5.1f} GiB, "
              f"TTFT p50 "
              f"{r.ttft_p50:6.2f} s p99 {r.ttft_p99:6.2f} s, errors {r.n_errors}")

pct = lambda r: round(100 * r.reuse, 2)
ram = sweep(BASE, "--cache-ram", ["0", "8192", "32768", "131072", "262144", "-1"])
show(ram)
# not asserted: the whole table; the figures the prose cites are asserted below
by_ram = {r.setting["--cache-ram"]: r for r in ram}
# never above the bound
assert all(r.error is None and r.n_errors == 0 and r.tokens_reused <= r.bound_tokens for r in ram)
sizes = ["8192", "32768", "131072", "262144"]
# more RAM, more reuse
assert all(by_ram[a].tokens_reused <= by_ram[b].tokens_reused for a, b in zip(sizes, sizes[1:]))
# ... but a small cache loses
assert by_ram["8192"].tokens_reused < by_ram["32768"].tokens_reused < by_ram["0"].tokens_reused
assert ([pct(by_ram[s]) for s in ("0", "8192", "32768", "131072", "262144")] == [3.56, 2.87, 3.03,
    3.69, 6.42])
assert round(100 * by_ram["262144"].of_bound, 1) == 39.2
# -1 is not unlimited here
assert by_ram["-1"].tokens_prefilled == by_ram["32768"].tokens_prefilled
assert round(by_ram["-1"].peak_cache_bytes / 2**30, 1) == 44.8"""),
    md("""Three things to read here.

* **More RAM never lowers reuse** once the cache is on: 8 → 32 → 128 → 256 GiB reuse 2.87, 3.03, 3.69
  and 6.42 % of the prompt tokens. Still well under the bound (256 GiB gets 39.2 % of it): the cache
  evicts its oldest entries first, an entry comes back only when the new prompt keeps at least a
  quarter of it (`f_keep` ≥ 0.25: an opening 512-token block shared with another conversation is
  below that floor), and the bound also counts prefixes that no slot or entry holds any more.
* **Turning a small cache on lowers reuse** below no cache at all (2.87 % with 8 GiB, 3.56 % without a
  cache). With a RAM cache and a unified pool llama-server saves every idle slot to the cache *and
  clears it* when a new task starts (`--cache-idle-slots`, on by default; docs/server-behaviour.md
  1.6). A conversation between turns then lives only in the cache, and a cache that holds four of
  them evicts it (`make_room`) before its next turn, where without a cache it would still sit in its
  slot. The next cell proves it: the same 8 GiB cache with `--no-cache-idle-slots` makes exactly the
  no-cache decisions.
* **`--cache-ram -1`** means no *byte* limit, not an infinite cache: the server still caps the cache
  at the context's token count (`-c`, 262,144 tokens = 32 GiB of state; the cache's peak, 44.8 GiB,
  includes the entry that tips it over before the `token_limit` evictions), so it makes exactly the
  decisions of 32 GiB."""),
    code("""from slotlab.figures import png
from slotlab.figures.whatif import sweep as sweep_figure

idle = sweep(BASE + ["--no-cache-idle-slots"], "--cache-ram", sizes)
show(idle, "--no-cache-idle-slots ")
print("--cache-ram -1 evictions:", by_ram["-1"].extra["evictions"])
# not asserted: the whole table; the figures the prose cites are asserted below
by_idle = {r.setting["--cache-ram"]: r for r in idle}
# the loss above is the idle-slot saves
assert by_idle["8192"].tokens_prefilled == by_ram["0"].tokens_prefilled
assert (all(by_idle[s].tokens_reused >= max(by_ram["0"].tokens_reused, by_ram[s].tokens_reused)
            for s in sizes))
assert all(by_idle[a].tokens_reused <= by_idle[b].tokens_reused for a, b in zip(sizes, sizes[1:]))
assert [r.setting["--cache-ram"] for r in idle] == ["8192", "32768", "131072", "262144"]
assert [pct(by_idle[s]) for s in sizes] == [3.56, 3.56, 4.10, 6.91] and pct(by_ram["0"]) == 3.56
assert round(100 * by_idle["131072"].of_bound, 1) == 25.0
assert by_ram["-1"].extra["evictions"] == {"token_limit": 399, "loaded": 72}
png.image(sweep_figure({"idle slots cached (default)": [by_ram[s] for s in sizes],
                        "--no-cache-idle-slots": [by_idle[s] for s in sizes]}, "--cache-ram",
                       refs={"--cache-ram 0": by_ram["0"]}, xlabel="--cache-ram (MiB)",
                       title="prompt tokens reused vs --cache-ram (Llama 3.1 8B, -np 4 -kvu -c "
                       "262144)"))"""),
    md("""Without idle-slot saves the cache only adds: at 8 and 32 GiB it changes nothing (3.56 %, the
no-cache figure), at 128 GiB it reuses 4.10 % and at 256 GiB 6.91 %, above the default's curve at
every size. The dotted line is no cache at all; the dashed one the bound.

## The RAM cache over time

Why does an 8 GiB cache change nothing? Follow the bytes it holds: `cache_timeline` runs one setting
with a listener on the server's `cache_alloc` / `cache_evict` events (each stamped with the simulated
time of the task launch it belongs to) and adds up the entries' sizes."""),
    code("""from collections import Counter
from slotlab.figures.whatif import cache_over_time
from slotlab.sim.whatif import cache_timeline

def timeline(extra):
    return cache_timeline(TRACE, BASE + extra, speed=SPEED, profile=str(PROFILE),
                          time_scale=TIME_SCALE,
                          label=" ".join(extra))

tls = [timeline(["--cache-ram", "8192"]),
       timeline(["--cache-ram", "8192", "--no-cache-idle-slots"]),
       timeline(["--no-cache-idle-slots", "--cache-ram", "131072"])]
full = [next(t for t, reason, *_ in tl.evictions if reason == "make_room") for tl in tls]
entry_gib = [(round(min(s for *_, s in tl.saves) / 2**30, 1),
              round(max(s for *_, s in tl.saves) / 2**30, 1)) for tl in tls]
for tl, t_full, (lo, hi) in zip(tls, full, entry_gib):
    print(f"{tl.label}: {len(tl.saves)} saves of {lo:.1f} to {hi:.1f} GiB; evictions "
          f"{dict(Counter(e[1] for e in tl.evictions))}; full (first make_room) after {t_full:.0f} "
          f"s; "
          f"peak {tl.peak / 2**30:.1f} GiB")
runs = [by_ram["8192"], by_idle["8192"], by_idle["131072"]]
assert (all(tl.peak == r.peak_cache_bytes and tl.totals["tokens_reused"] == r.tokens_reused for tl,
            r in zip(tls, runs)))
assert ([len(tl.saves) for tl in tls] == [471, 471, 491]
        and [round(t) for t in full] == [48, 48, 457])
assert [dict(Counter(e[1] for e in tl.evictions)) for tl in tls] == [
    {"make_room": 415, "loaded": 49}, {"make_room": 465}, {"make_room": 412, "loaded": 4}]
assert [tl.limit_bytes // 2**20 for tl in tls] == [8192, 8192, 131072]
assert [round(tl.peak / 2**30, 1) for tl in tls] == [8.0, 8.0, 128.0]
assert entry_gib == [(0.1, 6.8), (0.1, 6.8), (0.1, 14.9)]
png.image(cache_over_time(tls,
                          title="bytes held by the RAM cache, Llama 3.1 8B, -np 4 -kvu -c 262144"))"""),
    md("""8 GiB is full after 48 simulated seconds, and from then on every save pushes the oldest entries out
(`make_room`): a saved conversation is 0.1 to 6.8 GiB (one over 8 GiB is not cached at all: alone it
exceeds the limit), so the cache never holds more than a few. With idle-slot saves, 49 entries
come back into a slot (`loaded`, a hit), but those saves also cleared the slots that would have kept
their conversations, and reuse drops. With `--no-cache-idle-slots` not one entry comes back: all 465
evictions are `make_room`, so every reused token comes from a slot that still held its conversation,
as with no cache. 128 GiB (entries up to 14.9 GiB) fills in 457 seconds, and even then only 4 of its
491 saved entries are ever loaded back into a slot.

## Sweep 2: `-np`

Slots trade queueing against memory: all slots share the 262,144-token pool."""),
    code("""slots = sweep(BASE[:-2] + ["--cache-ram", "131072", "--no-cache-idle-slots"], "-np",
              ["1", "2", "8"])
show(slots, labels=[f"--cache-ram 131072 --no-cache-idle-slots -np "
                    f"{r.flags[r.flags.index('-np') + 1]}"
                    for r in slots])
print("-np 4 is sweep 1's --no-cache-idle-slots --cache-ram 131072 line; -np 8, the failed "
      "requests:",
      slots[2].extra["errors"])
slots.insert(2, by_idle["131072"])
# not asserted: the whole table; the figures the prose cites are asserted below
assert all(a.ttft_p50 > b.ttft_p50 for a, b in zip(slots, slots[1:]))   # more slots, less queueing
assert round(slots[0].ttft_p50) == 553 and slots[0].ttft_p50 > 9 * 60   # one slot: minutes
assert slots[3].n_errors == 16 > 0 == slots[0].n_errors + slots[1].n_errors + slots[2].n_errors
assert slots[3].extra["errors"] == {"500 Context size has been exceeded.": 16}
png.image(sweep_figure({"--cache-ram 131072 --no-cache-idle-slots": slots}, "-np", metric="ttft",
                       title="time to first token vs -np (Llama 3.1 8B, -kvu -c 262144)"))"""),
    md("""One slot queues everyone behind a 121,298-token prefill: the median request waits 553 s, over nine
minutes, for its first token; each doubling cuts the wait. Eight slots answer fastest but **fail
requests**: eight conversations of tens of thousands of tokens no longer fit the shared
262,144-token pool, and the server answers 16 of them with a 500 "Context size has been exceeded." (its
reuse and prefill figures then count only the requests that were served). Eight slots would need a
bigger `-c` (more GPU memory: 128 KiB a token)."""),
    md("""## Sweep 3: `--ctx-checkpoints`"""),
    code("""from slotlab.engine.params import ServerParams
ckpt = sweep(BASE + ["--cache-ram", "8192"], "--ctx-checkpoints", ["0", "4", "256"])
default = by_ram["8192"]   # sweep 1's run: the default --ctx-checkpoints 32
same = lambda r: (r.tokens_reused, r.tokens_prefilled, r.ttft_p50, r.ttft_p99,
                  r.peak_cache_bytes) == \\
    (default.tokens_reused, default.tokens_prefilled, default.ttft_p50, default.ttft_p99,
     default.peak_cache_bytes)
for r in ckpt:
    print(f"--ctx-checkpoints {r.setting['--ctx-checkpoints']:>3}: the same reuse, prefill, TTFT "
          f"and RAM cache as "
          f"the default (32): {same(r)}")
by_ck = {r.setting["--ctx-checkpoints"]: r for r in ckpt}
# the default (common.h: n_ctx_checkpoints = 32)
assert ServerParams().ctx_checkpoints == 32
# none of them changes a decision
assert same(by_ck["0"]) and same(by_ck["4"]) and same(by_ck["256"])"""),
    md("""No difference at all, and that is the answer for this model: Llama 3.1 is full attention, so the
server can cut a slot back to any position and never needs a context checkpoint (it makes them only
for sliding-window, hybrid and recurrent models, where a cut-back needs one: notebooks 06 and 09).
For Gemma 3 or Qwen3.5 it matters, and not only for reuse: the last part of this chapter."""),
    md("""## The setting to run

Among the settings above that served every request and kept the RAM cache within 128 GiB of host
memory, the one with the lowest median time to first token, and every setting of the three sweeps
side by side (the best in red; the hatched row failed requests):"""),
    code("""from slotlab.figures.whatif import overview
from slotlab.sim.whatif import best

BUDGET_MIB = 131072
pick = best([r for r in ram + idle + slots if r.n_errors == 0], BUDGET_MIB, "ttft_p50")
print("llama-server", " ".join(pick.flags))
print("it is sweep 1's --no-cache-idle-slots --cache-ram 131072 run:", pick is by_idle["131072"])
assert " ".join(pick.flags) == "-c 262144 -kvu -np 4 --no-cache-idle-slots --cache-ram 131072"
assert (pick is by_idle["131072"] and pick.peak_cache_bytes <= BUDGET_MIB * 2**20
        and pick.n_errors == 0)
assert pick.tokens_reused > by_ram["131072"].tokens_reused > by_ram["0"].tokens_reused
assert pick.ttft_p50 < min(r.ttft_p50 for r in ram if r.peak_cache_bytes <= BUDGET_MIB * 2**20)
every = ram + idle + [r for r in slots if r is not pick]   # -np 4 is the pick: drawn once
png.image(overview(every, pick=pick, budget_mib=BUDGET_MIB,
                   title="slotlab whatif: Mooncake conversation (500 requests), Llama 3.1 8B, -c "
                   "262144 -kvu"))"""),
    md("""`-np 4 -kvu -c 262144 --cache-ram 131072 --no-cache-idle-slots`: idle conversations stay in their
slots, and 128 GiB of RAM keeps the ones the slots had to give up. Even so it reuses 4.10 % of the
prompt tokens, 25.0 % of the bound: this trace's first 500 requests come back minutes later with
prompts that outgrow what 4 slots and 128 GiB hold. The whole day's trace (12,031 requests, in
`../shared/data/mooncake/` beside a checkout) answers better for a production server.
"""),
    md("""## Checkpoints on a 27B model: one checkpoint against `--cache-ram`

A RAM-cache entry is the slot's state **plus all its checkpoints**: `server_prompt_cache::alloc` adds
their sizes to the state's and skips the entry when the sum exceeds the cache's limit
(`prompt state size ... exceeds cache size limit ..., skipping`, server-task.cpp 1721-1734 at the
pin). On a 27B model one checkpoint is no longer small. Sized by the paper memory from the profiles
(`slotlab profiles`; `-c 131072`, the default 4 unified slots):"""),
    code("""from slotlab.memory.paper.memory import paper_sizes
from slotlab.memory.profile import row_size

MiB, GiB = 2**20, 2**30
big = {name: ModelProfile.from_json(ROOT / "slotlab" / "sim" / "profiles" / f"{name}.json")
       for name in ("gemma-3-27b", "qwen3.5-27b")}
ck_size, fits = {}, {}
for name, p in big.items():
    ck = ck_size[name] = paper_sizes(p, 8192, n_ctx=131072, n_slots=4, kv_unified=True)["partial"]
    fits[name] = 8192 * MiB // ck
    what = (f"the window cache: {p.n_swa:,} cells of {len(p.layers(swa=True))} sliding-window "
            f"layers" if p.n_swa
            else f"the recurrent state of {len(p.rs_layers())} of its {p.n_layer} layers")
    print(f"{p.name}: one checkpoint {ck / MiB:.0f} MiB ({what}); the default --ctx-checkpoints 32 "
          f"of them "
          f"{32 * ck / GiB:.1f} GiB; --cache-ram 8192 holds {fits[name]}")
g, q = big["gemma-3-27b"], big["qwen3.5-27b"]
cell = sum(row_size("f16", g.n_embd_k_gqa(il)) + row_size("f16", g.n_embd_v_gqa(il))
           for il in g.layers(swa=True))
assert (g.n_swa, len(g.layers(swa=True)), len(q.rs_layers()), q.n_layer) == (1024, 52, 48, 64)
# the window's K and V, plus cell metadata
assert g.n_swa * cell <= ck_size["gemma-3-27b"] < 1.001 * g.n_swa * cell
assert q.rs_bytes_per_seq() <= ck_size["qwen3.5-27b"] < 1.001 * q.rs_bytes_per_seq()
assert ([round(ck_size[n] / MiB) for n in big] == [416, 150]
        and [round(32 * ck_size[n] / GiB, 1) for n in big] == [13.0, 4.7])
assert fits == {"gemma-3-27b": 19, "qwen3.5-27b": 54}
# 32 of Gemma's alone overflow the default
assert 32 * ck_size["gemma-3-27b"] > 8192 * MiB > 32 * ck_size["qwen3.5-27b"]"""),
    md("""On Gemma 3 27B the default 32 checkpoints alone (13.0 GiB) are more than the default 8 GiB cache holds
(19 of them); on Qwen3.5 27B they take 4.7 GiB. How many does a slot hold? A chat request with a new part
longer than `4 + n_ubatch` tokens takes three checkpoints (spec 4.2; notebook 07 shows where): at the
start of its last user message (the chat endpoint sends the template's message delimiters) and
`4 + n_ubatch` and 4 tokens before the prompt's end. Nothing erases them while each turn extends the
last (only a cut-back erases the checkpoints beyond it), so a conversation adds three a turn, up to
`--ctx-checkpoints`.

A chat on paper, through the chat template and its delimiters as the chat endpoint sends them: Ana
reviews code, about 800 new tokens a turn after a 2,000-token system prompt; Ben, another user, sends
a short message between her turns. His first two requests take Ana's slot by similarity, and the
server saves her slot to the RAM cache before overwriting it (the `-sps` steal, at the end of this
chapter); from his third on, his prompt is long enough to go elsewhere, and when it launches the
idle-slot loop saves Ana's idle slot and, on the default unified KV, clears it (server-context.cpp
2417-2431). Either way her next turn loads her entry back. The paper memory has no weights:
a reply is a placeholder, which the next turn echoes."""),
    code("""from slotlab.lab import ask
from slotlab.llama import Model
from slotlab.serve.chat import ChatTemplate
from slotlab.sim.paper_replay import paper_engine

# the default model's tokenizer and chat template (ChatML); nothing is decoded
vocab = Model()
tmpl = ChatTemplate(vocab)
DELIMS = tmpl.delimiters()           # what the chat endpoint adds to each request
REVIEW = "You are a code reviewer. " + " ".join(
    f"Rule {i}: function f{i} must check argument a{i} and log error E{i}." for i in range(60))
change = lambda k: f"Review change {k}: " + " ".join(f"line {j}: x{j} = f{j}(a{j}) + {k}"
    for j in range(40))

def chat(name, flags, turns=10):
    \"\"\"Ana's and Ben's turns on the paper memory of `name`: Ana's (slot, cache_n, prompt_n)s.\"\"\"
    eng, _ = paper_engine(["-c", "131072", *flags], vocab=vocab, profile=big[name])
    hist = {"Ana": [{"role": "system", "content": REVIEW}],
            "Ben": [{"role": "system", "content": "You translate to German."}]}
    ana = []
    for k in range(turns):
        for u in ("Ana", "Ben"):
            hist[u].append({"role": "user", "content": change(k) if u == "Ana"
                            else f"Translate sentence {k}."})
            r = ask(eng, tmpl.apply(hist[u]), 8, message_delimiters=DELIMS)
            hist[u].append({"role": "assistant", "content": r["content"]})
            if u == "Ana":
                ana.append((r["id_slot"], r["timings"]["cache_n"], r["timings"]["prompt_n"]))
    eng.close()
    return eng, ana

def skipped(eng):
    \"\"\"(n_tokens, entry MiB) of each save the cache skipped, and the clear that followed it.\"\"\"
    out, log = [], eng.events.log
    for i, e in enumerate(log):
        if e.kind == "cache_skip_over_limit":
            nxt = next((f for f in log[i + 1:] if f.kind in ("slot_clear", "prompt_start")), None)
            out.append((e.data["n_tokens"], e.data["size"] / MiB, nxt is not None
                        and nxt.kind == "slot_clear"))
    return out

runs = {"defaults": chat("gemma-3-27b", [])}
eng, ana = runs["defaults"]
ck_per_turn = [sum(e.kind == "checkpoint_created" for e in eng.events.log if e.task == t)
               for t in range(0, 20, 2)]
held = [e.data["n_checkpoints"] for e in eng.events.log if e.kind == "cache_alloc"
        and e.data["n_tokens"] > 1000]
print("Ana, turn by turn (slot, cache_n, prompt_n):", ana)
print("checkpoints her requests took:", ck_per_turn, "| in her slot at each save:", held)
for n, size, cleared in skipped(eng):
    print(f"save of her {n:,} tokens skipped: {size:,.0f} MiB > 8,192 MiB; the slot cleared "
          f"anyway: {cleared}")
lost = next(i for i, (_, c, _) in enumerate(ana) if i and c == 0)
print(f"turn {lost}: cache_n {ana[lost][1]}, prompt_n {ana[lost][2]:,}: her whole conversation "
      f"re-processed")
# not asserted: Ana's per-turn counts other than those the text cites
assert ck_per_turn[:6] == [3] * 6 and held == [3, 6, 9, 12, 15, 4, 7, 10, 13]
assert skipped(eng)[0][1] > ServerParams().cache_ram == 8192   # the default --cache-ram, MiB
assert [(n, round(size), c) for n, size, c in skipped(eng)] == [(6111, 8382, True)]
assert (lost == 6 and ana[lost][1] == 0 and ana[lost][2] == 6907
        and all(c > 2000 for _, c, _ in ana[1:lost] + ana[lost + 1:]))
assert (18 * ck_size["gemma-3-27b"] < skipped(eng)[0][1] * MiB
        and round(18 * ck_size["gemma-3-27b"] / MiB) == 7488)
assert ana[1][1] == 2084    # her turn 1, loaded back from the RAM cache (the -sps steal, below)"""),
    md("""Three checkpoints a turn, 416 MiB each: after six turns Ana's slot holds 18 of them, 7,488 MiB, and with
her 6,111 tokens of state the entry is 8,382 MiB, over the 8,192 MiB limit. The save is skipped, and
the idle-slot loop clears the slot anyway (on a unified KV it clears every idle slot after trying to
save it, whether the save succeeded or not). Her conversation is gone: turn 6 re-processes all 6,907
tokens, on a 27B model seconds of GPU time. That prefill starts the checkpoint count over (4 held at
the next save), and the count climbs again toward the limit.

Separate slots (`-np 4` without `-kvu`) keep an idle slot's KV: the save is skipped just the same,
but the slot still holds Ana's conversation. The settings that fix it on the unified default:
**fewer checkpoints** (`--ctx-checkpoints 8`: 8 × 416 MiB = 3.3 GiB, the rest of the 8 GiB for the
state) or **a cache the checkpoints fit in** (`--cache-ram 16384`). And Qwen3.5 27B with the defaults:"""),
    code("""runs["-np 4 (not unified)"] = chat("gemma-3-27b", ["-np", "4"])
runs["--ctx-checkpoints 8"] = chat("gemma-3-27b", ["--ctx-checkpoints", "8"])
runs["--cache-ram 16384"] = chat("gemma-3-27b", ["--cache-ram", "16384"])
runs["qwen3.5-27b, defaults"] = chat("qwen3.5-27b", [])
largest = {}
for label, (eng, ana) in runs.items():
    sizes = [e.data["size"] for e in eng.events.log if e.kind == "cache_alloc"]
    largest[label] = max(sizes) / MiB
    print(f"{label:24s} Ana's cache_n per turn {[c for _, c, _ in ana]}; saves skipped "
          f"{len(skipped(eng))}, "
          f"slot cleared after one {sum(c for *_, c in skipped(eng))}; largest entry saved "
          f"{largest[label]:,.0f} MiB; "
          f"hit rate {eng.metrics.hit_rate:.1%}")
# not asserted: the per-turn lists (the picture's data); the asserts hold what the text cites
reuse = {label: [c for _, c, _ in ana] for label, (_, ana) in runs.items()}
# the same turns as the defaults' ...
assert reuse["--ctx-checkpoints 8"] == reuse["--cache-ram 16384"]
# ... but turn 6
assert ([a for i, (a, b) in enumerate(zip(reuse["defaults"], reuse["--ctx-checkpoints 8"]))
         if a != b] == [0])
# nobody else loses a turn
assert all(c > 2000 for label in runs for c in reuse[label][1:] if label != "defaults")
np4 = skipped(runs["-np 4 (not unified)"][0])
assert (len(np4) == 5 and not any(c for *_, c in np4)
        and {s for s, _, _ in runs["-np 4 (not unified)"][1][1:]} == {2})
# what the default lost, kept
assert reuse["-np 4 (not unified)"][6] == skipped(runs["defaults"][0])[0][0] == 6111
assert (not any(skipped(runs[k][0])
                for k in ("--ctx-checkpoints 8", "--cache-ram 16384", "qwen3.5-27b, defaults")))
assert {k: round(v) for k, v in largest.items()} == {"defaults": 7071, "-np 4 (not unified)": 7071,
    "--ctx-checkpoints 8": 4057,
                                                    "--cache-ram 16384": 13625,
                                                        "qwen3.5-27b, defaults": 5221}
assert largest["--cache-ram 16384"] > 8192 > largest["--ctx-checkpoints 8"]
assert (reuse["defaults"][1] == 2084 and reuse["--ctx-checkpoints 8"][6] == 6099
        and reuse["qwen3.5-27b, defaults"][1] == 2096)
assert ([f"{runs[k][0].metrics.hit_rate:.1%}" for k in runs] == ["73.2%", "83.6%", "83.4%", "83.4%",
    "83.8%"])

def ana_entries(eng):
    \"\"\"(turn, MiB, skipped) of each save of Ana's slot (over 1,000 tokens) after her turn.\"\"\"
    out = []
    for e in eng.events.log:
        if e.kind in ("cache_alloc", "cache_skip_over_limit") and e.data["n_tokens"] > 1000:
            out.append((len(out), e.data["size"] / MiB, e.kind == "cache_skip_over_limit"))
    return out

fig, ax = png.new(8, 3)
for label, colour, style in (("--cache-ram 16384", "#72b7b2", "o-"),
                             ("--ctx-checkpoints 8", "#4c78a8", "o-"),
                             ("qwen3.5-27b, defaults", "#f58518", "o-"),
                             ("defaults", "#e45756", "o--")):
    # the defaults drawn last: until turn 5 they are the 16384 line
    pts = ana_entries(runs[label][0])
    ax.plot([t for t, _, _ in pts], [m for _, m, _ in pts], style, color=colour, ms=4,
            label=label if label.startswith("qwen") else "gemma-3-27b, " + label)
    ax.plot([t for t, _, x in pts if x], [m for _, m, x in pts if x], "x", color="black", ms=10,
            mew=2)
ax.axhline(8192, color="grey", ls="--", lw=1); ax.text(-0.4, 8400, "--cache-ram 8192 (default)",
    color="grey", fontsize=8)
ax.axhline(16384, color="grey", ls=":", lw=1); ax.text(-0.4, 16600, "--cache-ram 16384",
    color="grey", fontsize=8)
ax.set_ylim(0,
            18500); ax.set_xlabel("Ana's turn (her slot saved after it: by Ben's steal, then by "
                                  "the idle-slot loop)"); ax.set_ylabel("entry: state + "
                                      "checkpoints (MiB)")
ax.set_title("RAM-cache entry of one conversation on 27B models (x: over the limit, skipped, slot "
             "cleared)", loc="left")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
skips = [(t, round(m)) for t, m, x in ana_entries(runs["defaults"][0]) if x]
assert skips == [(5, 8382)] and len(ana_entries(runs["defaults"][0])) == 10
png.image(fig)"""),
    md("""Every setting keeps Ana's conversation. Separate slots skip the save five times (every save from the one after
turn 5 on; the largest entry that still fit, 7,071 MiB, is the defaults' too) but never clear her
slot: she stays in it, and at turn 6 reuses the 6,111 tokens the unified default lost.
`--ctx-checkpoints 8` keeps her entries at 4,057 MiB or less; `--cache-ram 16384` takes entries of up
to 13,625 MiB (host memory the checkpoints cost). Qwen3.5 27B's checkpoints are about a third of
Gemma's, and its largest entry is 5,221 MiB: the defaults fit here, but its KV (64 KiB a token) and 32
checkpoints leave the state little room. The rule, for any
model: **state + `--ctx-checkpoints` × one checkpoint ≤ `--cache-ram`**, for the longest conversation
the cache must keep. How long a conversation keeps its entry once its slot holds a full list of checkpoints:"""),
    code("""def longest(name, n_ckpt, cache_mib=8192):
    \"\"\"The longest conversation whose entry (state + n_ckpt checkpoints) fits cache_mib.\"\"\"
    size = lambda n: paper_sizes(big[name], n, n_ctx=131072, n_slots=4,
                                 kv_unified=True)["state"] + n_ckpt * ck_size[name]
    lo, hi = 1024, 131072          # bisect: the entry grows with the conversation
    if size(lo) > cache_mib * MiB:
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= cache_mib * MiB else (lo, mid)
    return lo

limits = {(name, n): longest(name, n) for name in big for n in (32, 8)}
for (name, n), t in limits.items():
    print(f"{big[name].name}, {n:>2} checkpoints held, --cache-ram 8192: " +
          (f"conversations up to {t:,} tokens keep their entry" if t
           else "no conversation keeps its entry"))
assert ServerParams().cache_ram == 8192 and ServerParams().ctx_checkpoints == 32     # the defaults
assert (limits == {("gemma-3-27b", 32): 0, ("gemma-3-27b", 8): 56924, ("qwen3.5-27b", 32): 52050,
                   ("qwen3.5-27b", 8): 109485})"""),
    md("""With Gemma 3 27B's defaults no conversation with a full list keeps its entry (the 32 checkpoints alone
overflow 8 GiB); with `--ctx-checkpoints 8` conversations up to 56,924 tokens do. Qwen3.5 27B keeps
entries up to 52,050 tokens with the defaults, 109,485 with 8 checkpoints. What fewer checkpoints
cost: a branch back to an older turn than the last few finds no checkpoint there and is re-processed
(notebook 06), where a skipped entry loses the whole conversation. Size `--ctx-checkpoints` (or
`--cache-ram`) with this rule before the RAM cache drops your users' longest conversations."""),
    md("""## The `-sps` steal: a short prompt takes a long conversation's slot

Ben's first two requests above did not wait for the idle-slot loop: they **took Ana's slot**. The
server picks a slot by similarity first (`get_available_slot`, server-context.cpp:1541-1591): for
every idle slot that holds tokens, `f_sim` = the common prefix over the length of the **new** prompt,
and the best one above `-sps` (`slot_prompt_similarity`, 0.10 by default) wins. Every chat prompt
starts with the template's header (`<|im_start|>system\\nYou ` is 10 tokens for this tokenizer), so a
short unrelated prompt clears 0.10 on the header alone, and lands in the slot of the longest
conversation around. Then `f_keep` (what the slot keeps, 10 of its thousands) is below 0.5, so the
server saves that slot to the RAM cache before it overwrites it (1587-1589, then `prompt_save`,
1628). Where Ana goes next depends on the RAM cache and on the slot's layout:"""),
    code("""d_eng = runs["defaults"][0]
steals = []
for t in range(1, 7, 2):                         # Ben's first three requests
    dec = next(e.payload for e in d_eng.events.log if e.kind == "slot_decision" and e.task == t)
    slot, _, lcp, f_sim = max((c for c in dec.checks if c[1] is None), key=lambda c: c[3])  # Ana's
    saved = [e.data["n_tokens"] for e in d_eng.events.log if e.kind == "cache_save" and e.task == t]
    steals.append((t, d_eng.tasks[t].n_tokens, lcp, dec.how, f_sim, saved))
    print(f"task {t}: Ben's {d_eng.tasks[t].n_tokens} tokens share {lcp} with Ana's slot {slot} "
          f"(f_sim {f_sim:.3f}): slot by {dec.how}; get_available_slot saved {saved or 'nothing'}")
idle_saves = [e.data["n_tokens"] for e in d_eng.events.log
              if e.kind == "cache_save" and e.task == -1 and e.data["n_tokens"] > 1000]
print("Ana's slot saved by the idle-slot loop instead, after turns 2 to 9:", idle_saves)
where = {"defaults": runs["defaults"][1][:2]}
for label, flags in (("-np 4", ["-np", "4"]), ("-np 4 -sps 0.25", ["-np", "4", "-sps", "0.25"]),
                     ("-np 4 --cache-ram 0", ["-np", "4", "--cache-ram", "0"])):
    where[label] = chat("gemma-3-27b", flags, turns=2)[1]
for label, ((s0, _, n0), (s1, c1, p1)) in where.items():
    print(f"{label:20s} Ana's turn 1: slot {s1} (turn 0 in slot {s0}), cache_n {c1:,}, prompt_n "
          f"{p1:,}")
assert [(t, n, lcp, how) for t, n, lcp, how, _, _ in steals] == [
    (1, 47, 10, "lcp"), (3, 89, 10, "lcp"), (5, 131, 10, "lru")]
assert [f"{f:.3f}" for *_, f, _ in steals] == ["0.213", "0.112", "0.076"] and 10 / 131 < 0.10
assert [s for *_, s in steals] == [[2096], [2899], []]        # the first two saves: the steal's
assert idle_saves == [3702, 4505, 5308, 6111, 6914, 7717, 8520, 9323]
assert {k: v[1] for k, v in where.items()} == {
    "defaults": (2, 2084, 808), "-np 4": (2, 2084, 808), "-np 4 -sps 0.25": (3, 2096, 796),
    "-np 4 --cache-ram 0": (2, 0, 2892)}
# turn 0: the last slot (LRU, spec 1.3)
assert all(v[0][0] == 3 for v in where.values())"""),
    md("""* **Saved, then loaded back** (the defaults, and `-np 4`): Ana's next turn goes to an empty slot by
  LRU, which loads her entry (`f_keep` 1.0): 2,084 reused, not 2,096. The loaded slot is a *restored*
  one, which holds only the last `n_swa` positions of its window layers, so even continuing at its
  end needs a checkpoint ([notebook 01](01-tour.ipynb#A-restored-slot-keeps-only-the-window)): the
  server restores the one 4 tokens before her previous prompt's end and processes the reply again.
  On separate slots the steal moved her for nothing: without it she would have stayed live.
* **No steal** (`-sps 0.25`: 10/47 is below it): Ben goes to an empty slot by LRU, Ana stays in slot 3
  and reuses all 2,096 tokens with no checkpoint.
* **Saved nowhere** (`--cache-ram 0`): the steal overwrites her slot, and her next turn re-processes
  all 2,892 tokens.

A conversation the cache skips (over the limit, as at turn 5 above) or evicts before it returns is
lost the same way. A prompt steals a slot when it is shorter than `lcp / -sps` tokens: with a 10-token
header and `-sps 0.10`, anything under 100 tokens that shares only the header. Raising `-sps` to 0.25
or so keeps short one-off requests (titles, translations, a classifier's call) out of long
conversations' slots; `id_slot` pins them too, with its own condition (notebook 11)."""),
    md("""## Quantized KV: `-ctk` / `-ctv` and what `--cache-ram` holds

`-ctk q8_0 -ctv q8_0` (or `q4_0`) stores K and V in 8 or 4.5 bits a value instead of 16 (a q8_0 row
is 34 bytes per 32 values, q4_0 18; `ggml` block sizes), and a quantized V needs flash attention
(`-fa` auto, the default, gives it). Every size this chapter computed shrinks with it: the bytes a
token, the slot's state, a window checkpoint, so a RAM-cache entry. One thing does not: a recurrent
state, which llama.cpp keeps in f32 whatever `-ctk` says (`recurrent_type_r` / `_s`,
llama-model.cpp:2483-2484 and 2725-2726 at the pin), so Qwen3.5's checkpoints stay 150 MiB. Sized by the paper
memory (`-c 131072`, 4 unified slots): a conversation of 8,192 tokens and its entry with
`--ctx-checkpoints 8` full, and how many such entries `--cache-ram 8192` holds:"""),
    code("""QT = ("f16", "q8_0", "q4_0")
qsz = {}
for name, p in big.items():
    for t in QT:
        s = paper_sizes(p, 8192, n_ctx=131072, n_slots=4, kv_unified=True, type_k=t, type_v=t)
        entry = s["state"] + 8 * s["partial"]
        qsz[name, t] = (p.bytes_per_token(t, t), s["state"], s["partial"], entry,
                        8192 * MiB // entry)
        print(f"{name:12s} -ctk/-ctv {t:5s} KV {qsz[name, t][0]:>7,} B/token; 8,192 tokens: state "
              f"{s['state'] / MiB:5.0f} MiB, one checkpoint {s['partial'] / MiB:4.0f} MiB, "
              f"entry with 8 {entry / MiB:5.0f} MiB; --cache-ram 8192 holds {qsz[name, t][4]}")
mib = {k: tuple(round(x / MiB) for x in v[1:4]) for k, v in qsz.items()}
assert ServerParams().cache_ram == 8192
assert [qsz["gemma-3-27b", t][0] for t in QT] == [507_904, 269_824, 142_848]
assert [qsz["qwen3.5-27b", t][0] for t in QT] == [65_536, 34_816, 18_432]
assert ([mib["gemma-3-27b", t] for t in QT] == [(1056, 416, 4384), (561, 221, 2329),
                                                (297, 117, 1233)])
assert [mib["qwen3.5-27b", t] for t in QT] == [(662, 150, 1859), (422, 150, 1619), (294, 150, 1491)]
assert ([qsz["gemma-3-27b", t][4] for t in QT] == [1, 3, 6]
        and [qsz["qwen3.5-27b", t][4] for t in QT] == [4, 5, 5])
# 34 bytes per 32 values, not 64
assert qsz["gemma-3-27b", "q8_0"][0] * 32 == qsz["gemma-3-27b", "f16"][0] * 17"""),
    md("""On Gemma 3 27B, q8_0 roughly halves everything (34 bytes per 32 values against 64): the cache
holds 3 such conversations instead of 1, q4_0 holds 6. On Qwen3.5 27B the attention KV halves too, but
the entry is mostly checkpoints of the f32 recurrent state, so q8_0 gains one conversation (4 to 5)
and q4_0 nothing more. Ana's chat on Gemma 3 27B with `-ctk q8_0 -ctv q8_0` and otherwise the
defaults: the entry that overflowed 8 GiB at turn 5 now fits."""),
    code("""runs["-ctk q8_0 -ctv q8_0"] = chat("gemma-3-27b", ["-ctk", "q8_0", "-ctv", "q8_0"])
q_eng, q_ana = runs["-ctk q8_0 -ctv q8_0"]
q_largest = max(e.data["size"] for e in q_eng.events.log if e.kind == "cache_alloc") / MiB
print(f"-ctk q8_0 -ctv q8_0: saves skipped {len(skipped(q_eng))}; largest entry {q_largest:,.0f} "
      f"MiB; "
      f"Ana's turn 6 cache_n {q_ana[6][1]:,} (the defaults: {runs['defaults'][1][6][1]}); "
      f"hit rate {q_eng.metrics.hit_rate:.1%} (the defaults: "
      f"{runs['defaults'][0].metrics.hit_rate:.1%})")
assert not skipped(q_eng) and round(q_largest) == 7238 < 8192
assert q_ana[6][1] == 6099 and runs["defaults"][1][6][1] == 0
# the full cap alone: 6.9 GiB
assert 32 * qsz["gemma-3-27b", "q8_0"][2] / GiB > 6.9
assert (f"{q_eng.metrics.hit_rate:.1%}" == "83.4%"
        and f"{runs['defaults'][0].metrics.hit_rate:.1%}" == "73.2%")
assert [c for _, c, _ in q_ana] == [c for _, c, _ in runs["--ctx-checkpoints 8"][1]]"""),
    md("""The same reuse as `--ctx-checkpoints 8` or `--cache-ram 16384` (turn 6: 6,099 reused instead of 0),
with the default cap of 32 checkpoints and half the GPU memory for the KV cache. Not for long: the
largest entry is 7,238 MiB, and 32 checkpoints of 221 MiB are 6.9 GiB alone, so a few more turns
overflow 8 GiB again; the rule above holds with the smaller sizes (quantized KV is a model-quality
trade, too: measure it on your tasks before you take it). With `slotlab simulate` it is the same flags: `slotlab simulate
sessions.jsonl --profile gemma-3-27b -ctk q8_0 -ctv q8_0`."""),
    md("""## Try this
1. Your traffic: `slotlab whatif my-sessions.jsonl --vary "--cache-ram 0,8192,65536" --png grid.png`
   reads an OpenAI-messages session log (one line a call: `session_id`, `messages`, `output_length`,
   `gap`) and draws this notebook's last picture (`--html` the same as an interactive plotly page).
2. Eight slots without the errors: `--vary "-c 262144,524288"` with `-np 8` (and check the GPU has
   the 64 GiB of KV that 524,288 tokens take).
3. A model with a sliding window or recurrent layers (`--profile gemma-3-27b`, `--profile qwen3.5-27b`):
   sweep `--ctx-checkpoints 4,8,32` on the Mooncake trace and compare the RAM cache's skipped saves."""),
]
