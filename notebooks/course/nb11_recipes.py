"""Notebook 11-recipes: its cells (markdown and code), written by `notebooks/build_notebooks.py 11-recipes`."""

from course.cells import code, md

NAME = "11-recipes"

CELLS = [
    md("""# 11 · Recipes: flags and client rules for three kinds of model

Three set-ups people run, each with the flag set to start from, the reason for every flag, the rules
the client must keep, and how to check it on your own server:

1. **an agent on Qwen3.5 27B**, a hybrid model (a recurrent state beside every fourth attention layer);
2. **a multi-user chat on Gemma 3 27B**, a sliding-window (SWA) model with a 1024-token window;
3. **gpt-oss 20B / 120B**, SWA with a 128-token window, and reasoning the chat template drops.

Every figure here comes from the server's own decisions (slotlab's engine) run on the **paper memory**
with the model's profile (`slotlab profiles`: published hyperparameters; sizes exact, no weights, no
GPU), through the same `slotlab.sim.simulate` that `slotlab simulate` runs. The traffic is written as
OpenAI-messages session logs, the form `slotlab proxy --record` saves: each call's `messages` go
through the chat template to the tokens `/v1/chat/completions` decodes, with the template's message
delimiters, and the reply the model gave is played back as what it generated, so an echoed reply is
found again in the slot. Your own log runs the same way:

    slotlab simulate my-sessions.jsonl --profile qwen3.5-27b -np 2 -c 131072 --ctx-checkpoints 6

One caveat, said once: the prompts are tokenized by the default model (its ChatML template) for all
three; a real Qwen3.5 or gpt-oss tokenizer gives other counts, never other rules. gpt-oss's vocabulary
(201,088 ids) is smaller than that tokenizer's, so its profile is given the default model's vocabulary
size; that changes no byte of a cache or a checkpoint (asserted below).

**Defaults in this chapter.** Each recipe states its flags against the server's defaults: `-np` auto
(`4` slots, unified KV), `--cache-ram 8192`, `--ctx-checkpoints 32`, `--checkpoint-min-step 8192`,
`-ub 512`, `--cache-idle-slots` on, no `--swa-full`, `-sps 0.10`, `--cache-reuse 0`."""),
    code("""import dataclasses, json, tempfile
from collections import Counter
from pathlib import Path
from slotlab.llama import Model
from slotlab.memory.paper import PaperMemory
from slotlab.sim.cli import profile_rows, resolve_profile
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import load_sessions

# the tokenizer and chat template (ChatML) of every prompt below
model = Model(None)
# prefill / generation tokens per second: yours from `slotlab calibrate`
SPEED = SpeedModel.from_rates(2000, 40)
TMP = Path(tempfile.mkdtemp())

def profile(name):
    p = resolve_profile(name)
    return dataclasses.replace(p, n_vocab=max(p.n_vocab, model.n_vocab))

def run(calls, flags, name, chat=True):
    \"\"\"The session log `calls` under llama-server `flags` on the paper memory of profile `name`.
    chat=False sends the same prompts without message delimiters (what /completion gets).\"\"\"
    path = TMP / "sessions.jsonl"
    path.write_text("".join(json.dumps(c) + "\\n" for c in calls))
    trace = load_sessions(path, model=model)
    if not chat:
        for r in trace.requests:
            r.fields.pop("message_delimiters", None)
    return simulate(trace, flags, speed=SPEED, profile=profile(name), keep_events=True)

line = lambda topic, n: " ".join(f"Line {i} of {topic}: value {i * 7} sits in row {i % 5}."
                                 for i in range(n))
GiB, MiB = 2**30, 2**20
NAMES = ["qwen3.5-27b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b"]
rows = {r["profile"]: r for r in profile_rows(NAMES)}
for n, r in rows.items():
    print(f"{n:13s} {r['memory']:6s} KV {r['kv_bytes_per_token']:>7,} B/token  SWA "
          f"{r['n_swa'] or '-':>4}  "
          f"one checkpoint {r['checkpoint_bytes'][32768] / MiB:6.1f} MiB")
assert [rows[n]["kv_bytes_per_token"] for n in NAMES] == [65_536, 507_904, 49_152, 73_728]
assert ([rows[n]["n_swa"] for n in NAMES] == [0, 1024, 128, 128]
        and rows["qwen3.5-27b"]["memory"] == "hybrid")
assert ([round(rows[n]["checkpoint_bytes"][32768] / MiB, 1) for n in NAMES] == [149.6, 416.0, 3.0,
    4.5])
# the widened vocabulary changes no size: the same bytes per token, recurrent state, fingerprint
for n in NAMES:
    p, q = resolve_profile(n), profile(n)
    assert (p.bytes_per_token(), p.rs_bytes_per_seq(), p.fingerprint()) == (q.bytes_per_token(),
        q.rs_bytes_per_seq(), q.fingerprint())"""),
    md("""A **checkpoint** (notebooks 06 and 09) is a copy of what cannot be cut back: Qwen3.5's recurrent
state (149.6 MiB, whatever the prompt's length), Gemma 3's window cache (416.0 MiB), gpt-oss's (3.0 and
4.5 MiB). It lives in host RAM, up to `--ctx-checkpoints` (32) per slot, and travels with a slot's
state into the RAM cache, where it counts against `--cache-ram`.

## What the memory costs, before any request

The GPU holds the KV cache; `--swa-full` gives the sliding-window layers a cache of the whole context
instead of the window. Computed by the paper memory for `-c 131072` and each recipe's slots, beside
the host RAM that 32 checkpoints a slot may hold:"""),
    code("""from slotlab.engine.params import ServerParams
from slotlab.figures import png

def kv_gib(name, **kw):
    mem = PaperMemory(profile(name), n_ctx=131072, **kw)
    return sum(c.spec.size * c.spec.n_stream * c.spec.data_per_cell for c in mem.tgt.attn) / GiB

# each recipe's -np
SLOTS = {"qwen3.5-27b": 2, "gemma-3-27b": 6, "gpt-oss-20b": 4, "gpt-oss-120b": 4}
mem = {}
for n in NAMES:
    ck32 = 32 * SLOTS[n] * rows[n]["checkpoint_bytes"][32768] / GiB
    mem[n] = (kv_gib(n, n_slots=SLOTS[n]), kv_gib(n, n_slots=SLOTS[n], swa_full=True), ck32)
    print(f"{n:13s} -np {SLOTS[n]} -c 131072: KV {mem[n][0]:5.2f} GiB, with --swa-full "
          f"{mem[n][1]:5.2f} GiB; "
          f"32 checkpoints in each slot: {mem[n][2]:5.2f} GiB of host RAM")
assert [tuple(round(x, 2) for x in mem[n]) for n in NAMES] == [
    (8.00, 8.00, 9.35), (13.73, 62.48, 78.00), (3.07, 6.00, 0.38), (4.61, 9.00, 0.56)]
# -c 131072 split in six, padded to 256
assert PaperMemory(profile("gemma-3-27b"), n_ctx=131072, n_slots=6).n_ctx_seq == 22_016
assert [SLOTS[n] for n in NAMES] == [2, 6, 4, 4]
# no window: --swa-full changes nothing on Qwen3.5
assert mem["qwen3.5-27b"][0] == mem["qwen3.5-27b"][1]
# the default cap, per slot (common.h: n_ctx_checkpoints = 32)
assert ServerParams().ctx_checkpoints == 32

fig, ax = png.new(9, 2.8)
y = range(len(NAMES))
ax.barh([i + 0.27 for i in y], [mem[n][0] for n in NAMES], 0.27, label="KV cache (GPU)",
        color="#4c72b0")
ax.barh(list(y), [mem[n][1] for n in NAMES], 0.27, label="KV cache with --swa-full (GPU)",
        color="#dd8452")
ax.barh([i - 0.27 for i in y], [mem[n][2] for n in NAMES], 0.27,
        label="32 checkpoints in each of the -np slots (host RAM)", color="#937860")
ax.set_yticks(list(y), [f"{n} (-np {SLOTS[n]})" for n in NAMES])
ax.invert_yaxis()
ax.set_xlabel("GiB at -c 131072")
ax.legend(loc="lower right", fontsize=8)
ax.set_title("what each model's memory costs before any request (paper memory, published "
             "hyperparameters)")
png.image(fig)"""),
    md("""Three things decide the recipes. Qwen3.5 has no window, so `--swa-full` is moot there, but its
checkpoints are big. Gemma 3's `--swa-full` costs four and a half times the KV cache (62.48 GiB instead
of 13.73 for six slots),
and its checkpoints are the largest of all. gpt-oss's `--swa-full` only doubles a small cache, and
its checkpoints are nearly free; yet the gpt-oss recipe below does **not** take `--swa-full`.

## Recipe 1 · An agent on Qwen3.5 27B (hybrid)

```
llama-server -m Qwen3.5-27B.gguf -np 2 -c 131072 --ctx-checkpoints 6 --no-cache-idle-slots
```

| flag | why |
|---|---|
| `-np 2` | an explicit slot count leaves KV not unified: the agent's slot keeps its state while the other slot serves the client's side requests (a title, a summary). With auto `-np` every other launch saves the idle agent to the RAM cache and **clears** it |
| `-c 131072` | 65,536 tokens a slot (not unified: the context is split) |
| `--ctx-checkpoints 6` | each checkpoint is a full copy of the recurrent state (149.6 MiB), in host RAM. An agent that only appends needs none while its replies are echoed; the user's next message needs the one at the user's task (below). 6 keep it; 32 hold 4.53 GiB a slot for nothing more; 4 lose it |
| `--no-cache-idle-slots` | with slots that keep their state, the idle-slot loop only copies the agent's state (KV, recurrent state, checkpoints) to the RAM cache at every side request; a slot taken over by LRU is still saved |

Not in it: `--cache-reuse` (Qwen3.5's M-RoPE attention cannot shift: the server turns it off at load,
notebook 04), `--swa-full` (no window), `-cms`: Qwen3.5's template renders a tool result as a user
turn (`<|im_start|>user` and `<tool_response>`, models/templates/Qwen3.5-4B.jinja:131-142), so each
new tool result is the last user message, which the server checkpoints whatever `-cms` says
(server-context.cpp:3530-3537, 3605-3609).

The agent: a system prompt with the tool manual, one user task, then six turns of a reply (a tool call)
and the tool's result, rendered as Qwen3.5 renders it. Each variant changes one thing the client
does:"""),
    code("""MANUAL = "You are a coding agent. " + line("the tool manual", 150)
def agent(turns=6, *, echo=True, stamp=False, id_slot=None, side=False, think=4):
    system = lambda k: (f"Time: 10:{k:02d}. " if stamp else "") + MANUAL
    msgs = [{"role": "system", "content": system(0)},
            {"role": "user", "content": "Fix the failing test. " + line("the bug report", 40)}]
    calls = []
    for k in range(turns):
        reply = line(f"plan {k}", think) + f" Calling tool {k}: read file {k}."
        call = {"session_id": "agent", "messages": list(msgs), "reply": reply,
                "timestamp": 60.0 * k}
        if id_slot is not None:
            call["id_slot"] = id_slot
        calls.append(call)
        if side:   # the client's side request between two turns: a title for the chat
            calls.append({"session_id": f"title {k}",
                          "messages": [{"role": "user",
                                        "content": "A title for: " + line(f"chat {k}", 5)}],
                          "output_length": 8, "timestamp": 60.0 * k + 30})
        # not echoed: the reasoning is dropped
        sent = reply if echo else f"Calling tool {k}: read file {k}."
        # as Qwen3.5's template renders a tool result
        result = "<tool_response>\\n" + line(f"file {k}", 30) + "\\n</tool_response>"
        msgs = msgs + [{"role": "assistant", "content": sent}, {"role": "user", "content": result}]
        msgs[0] = {"role": "system", "content": system(k + 1)}
    return calls

Q = "qwen3.5-27b"
RECIPE_Q = "-np 2 -c 131072 --ctx-checkpoints 6 --no-cache-idle-slots"
variants = {"the recipe, reply echoed": (agent(), RECIPE_Q),
            "reply not echoed (reasoning dropped)": (agent(echo=False), RECIPE_Q),
            "a clock in the system prompt": (agent(stamp=True), RECIPE_Q),
            "auto -np, side requests": (agent(side=True), "-c 131072"),
            "auto -np, side requests, id_slot 0": (agent(side=True, id_slot=0), "-c 131072"),
            "the recipe, side requests": (agent(side=True), RECIPE_Q)}
res = {k: run(calls, flags, Q) for k, (calls, flags) in variants.items()}
turns = {k: [(x["cache_n"], x["cache_n"] + x["prompt_n"]) for x,
             c in zip(r.results, variants[k][0]) if c["session_id"] == "agent"]
         for k, r in res.items()}
for k, t in turns.items():
    print(f"{k:38s} cache_n per turn {[c for c, _ in t]}  ({sum(c for c, _ in t):,} of "
          f"{sum(n for _, n in t):,} prompt tokens)")
ok = turns["the recipe, reply echoed"]
assert [c for c, _ in ok] == [0, 3930, 4623, 5316, 6009, 6702] and sum(n for _, n in ok) == 33_501
# the previous prompt and the reply, all reused
assert all(c == n0 + 79 for (c, _), (_, n0) in zip(ok[1:], ok))
drop = turns["reply not echoed (reasoning dropped)"]
assert [c for c, _ in drop] == [0, 3847, 4470, 5093, 5716, 6339]
# each turn: the reply and 4 prompt tokens lost
assert all(c == n0 - 4 for (c, _), (_, n0) in zip(drop[1:], drop))
# the prefix changes: nothing is reused
assert [c for c, _ in turns["a clock in the system prompt"]] == [0] * 6
# migrates through the RAM cache ...
assert [c for c, _ in turns["auto -np, side requests"]] == [c for c, _ in ok]
# ... loaded back 5 times
assert res["auto -np, side requests"].totals["evictions"] == {"loaded": 5}
# pinned: never loaded back
assert [c for c, _ in turns["auto -np, side requests, id_slot 0"]] == [0] * 6
assert [c for c, _ in turns["the recipe, side requests"]] == [c for c, _ in ok]
assert {k: (sum(c for c, _ in t), sum(n for _, n in t)) for k, t in turns.items()} == {
    "the recipe, reply echoed": (26_580, 33_501),
        "reply not echoed (reasoning dropped)": (25_465, 32_451),
    "a clock in the system prompt": (0, 33_555), "auto -np, side requests": (26_580, 33_501),
    "auto -np, side requests, id_slot 0": (0, 33_501),
        "the recipe, side requests": (26_580, 33_501)}"""),
    md("""Drawn per turn: the bar is the prompt, the dark part what the server reused (`cache_n`)."""),
    code("""fig, ax = png.new(9, 3.2)
keys = list(turns)
w = 0.8 / len(keys)
colors = ["#4c72b0", "#dd8452", "#c44e52", "#8172b3", "#937860", "#55a868"]
for j, k in enumerate(keys):
    xs = [i + (j - len(keys) / 2 + 0.5) * w for i in range(len(turns[k]))]
    ax.bar(xs, [n for _, n in turns[k]], w, color=colors[j], alpha=0.25)
    ax.bar(xs, [c for c, _ in turns[k]], w, color=colors[j], label=k)
ax.set_xticks(range(6), [f"turn {i}" for i in range(6)])
ax.set_ylabel("prompt tokens (dark: reused)")
ax.set_ylim(0, 1.45 * max(n for t in turns.values() for _, n in t))   # room for the legend
ax.legend(fontsize=7, ncol=3, loc="upper left")
ax.set_title("agent on Qwen3.5 27B: tokens reused per turn, by what the client and the flags do")
assert len(ax.patches) == 2 * 6 * len(keys)
png.image(fig)"""),
    md("""The client rules, each read off a bar:

* **Echo the reply verbatim.** The slot holds the prompt *and* the reply it generated; the next prompt
  finds both (turn 1: 3,930 reused, the whole previous prompt and the 79 reply tokens). Sent back
  without its reasoning, the prompt differs where the reply began. A recurrent state cannot be cut
  back, so the server restores its newest checkpoint, taken 4 tokens before the previous prompt's end
  (server-context.cpp:3539-3556 at the pin): the reply and 4 tokens are processed again, every turn.
  Qwen3.5's own template does this to you: it renders the reasoning only of the assistant turns after
  the last user message (llama.cpp's models/templates/Qwen3.5-4B.jinja:100), so the first call after a
  new user message always diverges at the earlier turns' replies; the server's checkpoint at that
  last user message (server-context.cpp:3530-3537 and 3605-3609) is what it falls back to,
  and only the chat endpoint (message delimiters) gives it.
* **Keep the prefix byte-stable.** A clock, a request id or a shuffled tool list near the top
  changes the prompt a few tokens in; no checkpoint lies that early, so every turn is processed from
  scratch.
* **Use the chat endpoint**, or send `message_delimiters` yourself: checkpoints land at user messages
  only when the server knows where they start.
* **`id_slot` on an empty slot skips the RAM cache.** A request that names its slot takes that slot
  even when it is empty, and the server then computes `f_keep = 0 / 0`, NaN, which is never `< 0.5`:
  no save, no load (server-context.cpp:1533-1538, 1578-1589; upstream issue #28139). A pinned slot
  that holds tokens still goes through the cache logic ("still goes through cache update logic
  below", 1533): a prompt that keeps less than half of it (`f_keep < 0.5`, or `f_keep` 0 when its
  similarity is not above `-sps`) saves it and loads the best entry; only `f_keep >= 0.5`, an empty
  slot or `-sps 0` leave the cache alone. With auto `-np` the idle-slot loop has just saved
  the agent to the RAM cache and cleared slot 0 (server-context.cpp:2417-2431), so the pinned agent
  re-processes everything, every turn; unpinned, LRU takes it back from the cache (`loaded` 5 times).

## Checkpoints a long agent holds

Twenty-four turns, default cap against the recipe's:"""),
    code("""def new_query(calls, text="Now update the docs too."):
    \"\"\"The user's next message after the loop: Qwen3.5's template now renders none of the earlier
    turns' reasoning, only their tool calls.\"\"\"
    last = calls[-1]
    msgs = last["messages"] + [{"role": "assistant", "content": last["reply"]}]
    msgs = [{"role": "assistant", "content": m["content"][m["content"].index("Calling tool"):]}
            if m["role"] == "assistant" else m
            for m in msgs]
    return calls + [{"session_id": "agent", "messages": msgs + [{"role": "user", "content": text}],
                     "reply": "Done.",
                     "timestamp": last["timestamp"] + 60}]

long = new_query(agent(24))
ck = {cap: run(long, RECIPE_Q.replace("--ctx-checkpoints 6", f"--ctx-checkpoints {cap}"), Q)
      for cap in (32, 6, 4)}
most = {cap: max(int(e.message.split()[3]) for e in r.engine.events.log
                 if e.kind == "checkpoint_created") for cap, r in ck.items()}
for cap, r in ck.items():
    loop, last = r.results[:-1], r.results[-1]
    print(f"--ctx-checkpoints {cap:2d}: at most {most[cap]} held, "
          f"{most[cap] * rows[Q]['checkpoint_bytes'][32768] / GiB:.2f} GiB; "
          f"the loop reused {sum(x['cache_n'] for x in loop):,}; the new user message "
          f"{last['cache_n']:,} of {last['cache_n'] + last['prompt_n']:,}")
assert (most == {32: 31, 6: 5, 4: 4}
        and [round(most[c] * rows[Q]["checkpoint_bytes"][32768] / GiB, 2) for c in most] == [4.53,
            0.73, 0.58])
# the loop: the same
assert (all([x["cache_n"] for x in r.results[:-1]] == [x["cache_n"] for x in ck[32].results[:-1]]
            for r in ck.values()))
assert sum(x["cache_n"] for x in ck[4].results[:-1]) == 268_605
assert [ck[c].results[-1]["cache_n"] for c in (32, 6, 4)] == [3051, 3051, 0]
assert all(r.results[-1]["cache_n"] + r.results[-1]["prompt_n"] == 18_642 for r in ck.values())
# the user's task, where 3,051 ends
assert long[-1]["messages"][1]["content"].startswith("Fix the failing test")
first_reply = ck[6].results[0]["cache_n"] + ck[6].results[0]["prompt_n"]
assert first_reply == 3851 > 3051"""),
    md("""Inside the loop the cap changes nothing, turn by turn. It matters at the user's next message: the
template drops the reasoning of all 24 turns, the prompt differs from the slot where the first reply
began (token 3,851), and the server needs a checkpoint at or before that. The one it falls back to is
the oldest, taken where the user's task starts (3,051 kept, with 32 or 6). With 4 it is gone and the
whole 18,642-token prompt is processed again: each request creates checkpoints of its own (at the last
user message, `4 + n_ubatch` and 4 tokens before its end), which the cap's too-close rule never erases
(server-context.cpp:2290-2320), so a cap that small pushes out the oldest first. Six keep it, at
0.73 GiB of host RAM against 4.53. A client that branches back (regenerates or edits an earlier turn)
needs older checkpoints still: raise the cap.

## Recipe 2 · A multi-user chat on Gemma 3 27B (SWA)

```
llama-server -m gemma-3-27b-it.gguf -np 6 -c 131072 --ctx-checkpoints 4 --no-cache-idle-slots
```

| flag | why |
|---|---|
| `-np 6` | one slot per user you serve at once, KV not unified: each slot's window cache is its own, so a user's next turn finds everything (below). With auto `-np` (4 unified slots) two of six users are always in the RAM cache |
| `-c 131072` | 22,016 tokens a slot (the context split in six, rounded up to a multiple of 256) |
| no `--swa-full` | four and a half times the KV cache (62.48 GiB instead of 13.73) for prompts that only grow: echoed replies need no checkpoint without it |
| `--ctx-checkpoints 4` | a Gemma 3 27B checkpoint is 416.0 MiB, in host RAM; a chat falls back on its newest ones (the last user message, the prompt's end) |
| `--no-cache-idle-slots` | as for the agent: slots that keep their state need no copy at every launch |

Six users, five turns each, a shared 1,700-token system prompt, replies of about 420 tokens, echoed:"""),
    code("""HANDBOOK = "You are the help desk of a bank. " + line("the policy handbook", 120)
def chat(users=6, turns=5, reply=20):
    calls, convs = [], {u: [{"role": "system", "content": HANDBOOK}] for u in range(users)}
    for k in range(turns):
        for u in range(users):
            msgs = convs[u] + [{"role": "user",
                                "content": f"User {u}, question {k}: " + line(f"case {u}-{k}", 12)}]
            answer = f"Answer {k} to user {u}: " + line(f"answer {u}-{k}", reply)
            calls.append({"session_id": f"user {u}", "messages": msgs, "reply": answer,
                          "timestamp": 40.0 * k + 3.0 * u})
            convs[u] = msgs + [{"role": "assistant", "content": answer}]
    return calls

G = "gemma-3-27b"
RECIPE_G = "-np 6 -c 131072 --ctx-checkpoints 4 --no-cache-idle-slots"
talk = chat()
gem = {f: run(talk, f, G)
       for f in ("-c 131072", "-c 131072 --swa-full", "-np 6 -c 131072", RECIPE_G)}
pct = lambda r: round(100 * r.totals["tokens_reused"] / r.totals["prompt_tokens"], 1)
def held_gib(r):
    return sum(c.size() for s in r.engine.core.slots for c in s.checkpoints) / GiB
for f, r in gem.items():
    print(f"{f:58s} reused {pct(r):4.1f} %  peak RAM cache "
          f"{r.totals['peak_cache_bytes'] / GiB:5.2f} GiB  "
          f"checkpoints held {held_gib(r):5.2f} GiB")
total = gem[RECIPE_G].totals["prompt_tokens"]
assert (total == 122_430
        and all(r.totals["prompt_tokens"] == total and r.totals["n_errors"] == 0
                for r in gem.values()))
assert [pct(r) for r in gem.values()] == [46.2, 57.2, 81.4, 81.4]
assert ([round(r.totals["peak_cache_bytes"] / GiB, 2) for r in gem.values()] == [7.59, 4.01, 7.54,
    0.00])
# the cap and the loop cost nothing
assert gem["-np 6 -c 131072"].totals["tokens_reused"] == gem[RECIPE_G].totals["tokens_reused"]
assert (gem[RECIPE_G].totals["peak_cache_bytes"] == 0 < gem["-np 6 -c 131072"].totals["peak_cache_bytes"])
# --swa-full: none taken
assert [round(held_gib(r), 2) for r in gem.values()] == [7.72, 0.00, 36.56, 9.75]
# the --swa-full run's own KV cache
auto_full = kv_gib(G, n_slots=4, kv_unified=True, swa_full=True)
print(f"KV cache with --swa-full: {auto_full:.2f} GiB on auto -np (4 unified slots), "
      f"{mem[G][1]:.2f} GiB on -np 6")
assert (round(auto_full, 2), round(mem[G][1], 2)) == (62.00, 62.48)
assert " -np 6 -c 131072 " in f" {RECIPE_G} " and "--ctx-checkpoints 4" in RECIPE_G"""),
    md("""One slot per user reuses 81.4 % of the prompt tokens against 46.2 % on auto `-np`, and the recipe's
cap and `--no-cache-idle-slots` cost nothing of it: the same reuse with no RAM-cache copies, and
9.75 GiB of checkpoints in host RAM instead of 36.56.

Why auto `-np` loses: its four slots share one KV pool, so six users keep two conversations in
the RAM cache, and a conversation restored from it has lost the cells that the window masks: the
server writes a sliding-window cache's state without them (llama-kv-cache.cpp:2092-2097 at the pin).
The restored slot's `pos_min` then sits a window below its end, and continuing needs a checkpoint
(the rule of notebook 01): the server restores the one 4 tokens before the previous prompt's end, and
processes the reply again. `--swa-full` on auto `-np` recovers part of that (57.2 %) at 62.00 GiB of
KV (four unified slots; the recipe's six would take 62.48). One slot
per user keeps every conversation where it is, and the reply is found again without any checkpoint:
the window cache keeps `n_swa + n_ubatch` cells per slot (1,536 here), so the cut-back at the reply's
end stays within the cells still held.

Client rules, as for the agent: the system prompt byte-stable across users (it is the shared prefix),
replies echoed verbatim, the chat endpoint (so the last user message gets its checkpoint, which is
what a user who edits their last message falls back to), and no `id_slot`: with more users than
slots, a pinned slot holding another user's conversation is saved and loaded over *even while it is
busy* (docs/server-behaviour.md 1.4).

## Recipe 3 · gpt-oss 20B / 120B (SWA, a 128-token window)

```
llama-server -m gpt-oss-120b.gguf -np 4 -c 131072
```

| flag | why |
|---|---|
| `-np 4` | four slots, KV not unified; more users than that go through the RAM cache |
| `-c 131072` | 32,768 tokens a slot |
| no `--swa-full` | it looks cheap (9.00 GiB instead of 4.61 on 120B) and is a trap: it turns checkpoints off (the server's `n_swa` becomes 0, server-context.cpp:1185, 3451-3454) while the state it saves to the RAM cache still holds only the window (llama-kv-cache.cpp:2094; the SWA cache keeps its `n_swa` 128 under `--swa-full`, llama-kv-cache-iswa.cpp:102-105). A conversation restored from the cache then has nothing to go back to |
| `--ctx-checkpoints 32`, `--cache-ram 8192` (defaults) | a checkpoint is 3.0 / 4.5 MiB: the default cap costs nothing worth capping |

The template drops the reasoning: gpt-oss's renders no earlier turn's analysis in inference (a tool
call's only until a final answer follows it; models/templates/openai-gpt-oss-120b.jinja:274-306), so
every next turn differs from the slot where the reply began, some 600 reasoning tokens back. Six
users, four turns:"""),
    code("""GUIDE = "You are a research assistant. " + line("the style guide", 80)
def oss(users=6, turns=4, think=40):
    calls = []
    for u in range(users):
        msgs = [{"role": "system", "content": GUIDE}]
        for k in range(turns):
            msgs = msgs + [{"role": "user",
                            "content": f"Question {k}: " + line(f"topic {u}-{k}", 10)}]
            final = f"Answer {k}: " + line(f"answer {u}-{k}", 5)
            calls.append({"session_id": f"user {u}", "messages": list(msgs),
                          "timestamp": 60.0 * k + 5 * u,
                          "reply": {"role": "assistant", "content": final,
                                    "reasoning_content": line(f"reasoning {u}-{k}", think)}})
            # what the template renders back: the final answer
            msgs = msgs + [{"role": "assistant", "content": final}]
    return calls

RECIPE_O = "-np 4 -c 131072"
asks = oss()
flagsets = ["-c 131072", RECIPE_O, RECIPE_O + " --swa-full"]
gpt = {(n, f): run(asks, f, n) for n in ("gpt-oss-20b", "gpt-oss-120b") for f in flagsets
       if n == "gpt-oss-20b" or f != flagsets[0]}
for (n, f), r in gpt.items():
    resets = sum(1 for e in r.engine.events.log if e.kind == "checkpoint_none")
    print(f"{n:13s} {f:30s} reused {pct(r):4.1f} %  full re-processing {resets} times")
# the same decisions on both
assert all(gpt["gpt-oss-20b", f].results == gpt["gpt-oss-120b", f].results for f in flagsets[1:])
assert [pct(gpt["gpt-oss-20b", f]) for f in flagsets] == [68.8, 70.2, 45.7]
assert all(r.totals["prompt_tokens"] == 55_584 for r in gpt.values()) and "-c 131072" in flagsets[0]
resets = {f: sum(1 for e in gpt[n, f].engine.events.log if e.kind == "checkpoint_none") for n,
          f in gpt}
assert resets == {"-c 131072": 0, RECIPE_O: 0, RECIPE_O + " --swa-full": 6}"""),
    md("""The same decisions on 20B and 120B (the window and the layer pattern decide; only the bytes
differ). Without `--swa-full` every next turn restores a checkpoint near the previous prompt's end,
and 70.2 % of the prompt tokens are reused; with it, six turns that came back from the RAM cache were
processed from scratch and reuse falls to 45.7 %.

Client rules for gpt-oss: echo the final answer verbatim and let the template drop the analysis (the
model expects it gone; the checkpoint 4 tokens before the previous prompt's end absorbs it); keep the
system and developer messages byte-stable; use the chat endpoint; no `id_slot`.

## Check it on your own server

What each recipe promises can be read off three outputs of the real server; the same outputs of the
runs above (the engine answers `/slots` and `/metrics` as the server does, and prints its log lines):

* **`GET /slots`** (on by default): per slot `n_prompt_tokens`, the tokens it holds now, and while a
  request runs `n_prompt_tokens_cache` (after the release the request's stats are zeroed;
  docs/server-behaviour.md 8.1). Nothing about checkpoints or the RAM cache.
* **`--metrics`**: `llamacpp:prompt_tokens_cached_total` (the reused tokens) against
  `llamacpp:prompt_tokens_total` (the processed ones); their ratio is your hit rate.
* **`-lv 4`** (the default is 3): `restored context checkpoint (..., n_past = N)` is a cut-back a
  checkpoint saved (N tokens kept); `forcing full prompt re-processing` a miss with no checkpoint to
  fall back to; `created context checkpoint k of N` shows the cap; `- found better prompt` a RAM-cache
  hit; `saving idle slot to prompt cache` the idle-slot loop at work."""),
    code("""LINES = {"restored": "restored context checkpoint", "forced": "forcing full prompt re-processing",
         "created": "created context checkpoint", "loaded": "- found better prompt",
         "idle save": "saving idle slot"}
def lv4(r):
    return {k: sum(1 for e in r.engine.events.log if e.message.lstrip().startswith(t)) for k,
            t in LINES.items()}
def metrics(r):
    m = r.engine.metrics
    return m.prompt_tokens_cached_total, m.prompt_tokens_total
checks = {"agent, recipe": res["the recipe, side requests"],
          "agent, id_slot 0": res["auto -np, side requests, id_slot 0"],
          "chat, auto -np": gem["-c 131072"], "chat, recipe": gem[RECIPE_G],
          "gpt-oss, recipe": gpt["gpt-oss-120b", RECIPE_O],
          "gpt-oss, --swa-full": gpt["gpt-oss-120b", RECIPE_O + " --swa-full"]}
for k, r in checks.items():
    cached, processed = metrics(r)
    print(f"{k:20s} /metrics cached {cached:>7,} processed {processed:>7,} (hit rate "
          f"{100 * cached / (cached + processed):4.1f} %)  -lv 4: {lv4(r)}")
slots = checks["agent, recipe"].engine.slots_json()
print("/slots after the agent:",
      [(s["id"], s["n_prompt_tokens"], s["is_processing"]) for s in slots])
for k, r in checks.items():   # the counters are the per-request figures summed
    assert metrics(r) == (r.totals["tokens_reused"], r.totals["tokens_prefilled"])
assert [round(100 * r.totals["tokens_reused"] / r.totals["prompt_tokens"], 1)
        for r in checks.values()] == [
    77.8, 0.0, 46.2, 81.4, 70.2, 45.7]
assert {k: (metrics(r), lv4(r)) for k, r in checks.items()} == {
    "agent, recipe": ((26_585, 7_606),
                      {"restored": 5, "forced": 0, "created": 30, "loaded": 0, "idle save": 0}),
    "agent, id_slot 0": ((0, 34_191),
                         {"restored": 0, "forced": 0, "created": 35, "loaded": 0, "idle save": 36}),
    "chat, auto -np": ((56_531, 65_899),
                       {"restored": 23, "forced": 0, "created": 93, "loaded": 9, "idle save": 30}),
    "chat, recipe": ((99_660, 22_770),
                     {"restored": 0, "forced": 0, "created": 90, "loaded": 0, "idle save": 0}),
    "gpt-oss, recipe": ((39_040, 16_544),
                        {"restored": 20, "forced": 0, "created": 72, "loaded": 6, "idle save": 24}),
    "gpt-oss, --swa-full": ((25_384, 30_200),
                            {"restored": 0, "forced": 6, "created": 0, "loaded": 6,
                             "idle save": 24})}
assert (lv4(checks["agent, id_slot 0"])["forced"] == 0
        and lv4(checks["agent, id_slot 0"])["loaded"] == 0)
assert lv4(checks["agent, recipe"])["idle save"] == 0 < lv4(checks["agent, id_slot 0"])["idle save"]
assert (lv4(checks["gpt-oss, --swa-full"])["forced"] == 6
        and lv4(checks["gpt-oss, --swa-full"])["created"] == 0)
assert lv4(checks["gpt-oss, recipe"])["forced"] == 0 < lv4(checks["gpt-oss, recipe"])["restored"]
assert [(s["id"], s["is_processing"]) for s in slots] == [(0, False), (1, False)]
assert ([s["n_prompt_tokens"] for s in slots] == [122, 7_395] == [len(s.tokens)
    for s in checks["agent, recipe"].engine.core.slots])"""),
    md("""## Try this
1. Record your own traffic (`slotlab proxy --record sessions.jsonl` in front of your server) and run it
   through each recipe: `slotlab simulate sessions.jsonl --profile gemma-3-27b --why -np 6 -c 131072`;
   `--why` names the client changes between calls (a reply not echoed, a changed prefix).
2. Give the agent a client that regenerates its last turn: how many checkpoints does it need now?
3. Sweep `-np` for the chat with `slotlab whatif` (`--vary "-np 4,6,8"`): where do the errors start?

Next: [12 · Beyond the flags](12-beyond-the-flags.ipynb): what no flag does, the ideal cache of the
same memory and each change proposed upstream, priced on a real trace."""),
]
