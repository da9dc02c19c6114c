"""Notebook 01-tour: its cells (markdown and code), written by `notebooks/build_notebooks.py 01-tour`."""

from course.cells import code, md

NAME = "01-tour"

CELLS = [
    md("""# 01 · A tour of llama-server's slots, on a live model

`llama-server` keeps one **slot** per parallel sequence (`-np`, default *auto* = 4 slots sharing one
**unified** KV pool). For every request it picks a slot, decides how much of the prompt it can reuse
(`cache_n`) and prefills the rest (`prompt_n`). Between requests a **RAM prompt cache**
(`--cache-ram`, 8192 MiB by default) keeps prompts that slots had to give up. slotlab runs exactly
that machinery on a real `llama_context` (Gemma 3 270M), and this notebook walks through it with the
server's defaults. Every number a cell prints is asserted in that cell. The one exception is the live
panel, a widget that draws the same state as the pictures.

The defaults this chapter runs with (`common.h` at the pin): `-np` auto (4 slots, unified KV),
`--cache-ram 8192` MiB, `--cache-idle-slots` on, `-sps 0.10`, `--ctx-checkpoints 32`,
`--checkpoint-min-step 8192`, `--cache-reuse 0` (off), no `--swa-full`. Only `-c` is smaller here."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, why
from slotlab.panel import Panel

eng = Engine("-c 8192")          # the server's defaults, a smaller context to stay quick
print(eng.slots_json()[0] | {"n_slots": len(eng.slots)})
assert len(eng.slots) == 4 and eng.ctx.kv_unified and eng.slots_json()[0]["n_ctx"] == 8192"""),
    md("""The panel shows every slot's tokens coloured by where they came from, the checkpoint chain, the
RAM cache with each entry's `f_keep` / `f_sim`, the event log and a plain-words *why* per request.
Run the cells below and watch it: in step mode it redraws when a cell finishes. Where no kernel runs,
the static pictures further down show the same things."""),
    code("""panel = Panel(eng)
panel""", ignore=True),
    md("""## Three users

Alice and Bob chat; Carol sends an unrelated one-off question in between. The first request of an
empty server lands in the **last** slot: all slots have `t_last_used = -1` and the LRU rule keeps the
last of equal timestamps (`<=`, spec 1.3)."""),
    code("""SYSTEM = "You are a precise assistant for a shipping company. Answer briefly. "
alice1 = SYSTEM + "User Alice: which ports handle container ships in the north sea?"
bob1 = SYSTEM + "User Bob: how long does customs clearance take?"
r_a1 = ask(eng, alice1, 8); print(summary(r_a1))
r_b1 = ask(eng, bob1, 8); print(summary(r_b1))
assert (r_a1["id_slot"] == 3 and r_a1["timings"]["cache_n"] == 0
        and r_a1["timings"]["prompt_n"] == 27)
# 27 prompt + 8 generated - 1
assert r_a1["tokens_evaluated"] == 27 and r_a1["tokens_cached"] == 34
assert (r_b1["id_slot"] == 3 and r_b1["timings"]["cache_n"] == 0
        and r_b1["timings"]["prompt_n"] == 24)
assert r_b1["tokens_evaluated"] == 24 and r_b1["tokens_cached"] == 31"""),
    md("""Bob's request went to Alice's slot, and nothing of it was reused. The server's decisions, from
the engine's events:"""),
    code("""def event(kind, task):
    return next(e.payload for e in eng.events.log if e.kind == kind and e.task == task)

d = event("slot_decision", 1)
saved = event("cache_alloc", 1)
lcp = d.held.lcp
print(f"slot chosen by {d.how}: f_sim {d.f_sim:.3f} = {lcp}/24 (> -sps 0.10), f_keep "
      f"{d.f_keep:.3f} = {lcp}/34 (< 0.50)")
print(f"so the RAM cache was updated first: slot {saved.id_slot}'s {saved.n_tokens} tokens "
      f"(Alice's) saved as "
      f"entry #{saved.entry_id} with {saved.n_checkpoints} checkpoint")
print(why(eng))
assert d.how == "lcp" and lcp == 15 and d.update_cache
assert f"{d.f_sim:.3f} {d.f_keep:.3f}" == "0.625 0.441" and 0.10 < d.f_sim and d.f_keep < 0.50
assert (saved.id_slot, saved.n_tokens, saved.entry_id, saved.n_checkpoints) == (3, 34, 0, 1)
assert "f_sim 0.62 > 0.10" in why(eng) and "0 tokens reused, 27 prefilled" in why(eng)
assert "no usable checkpoint: full re-processing forced; 0 tokens reused, 24 prefilled" in why(eng)"""),
    md("""## The server's decisions, in order

Every request goes through the same steps, and each later chapter explains one of them. The picture
names the server's function for each step (`tools/server/server-context.cpp`), and writes beside it
what Bob's request (task 1) did there, read from the engine's events. A grey box is a step that did
nothing for this request:

* **slot choice** (`get_available_slot`): a slot by similarity, else the least recently used one;
* **RAM cache save / load**: on LRU, or when the chosen slot would lose more than half of what it holds,
  the slot is saved (`prompt_save`) and the best entry loaded (`prompt_load`; notebook 02);
* **n_past**: the common prefix; **shift**: `--cache-reuse` (notebook 04);
* **the checkpoint rule**: can the memory be cut back to `n_past`? (below; notebook 06);
* **prefill**, taking checkpoints; **release**: the slot goes idle with its tokens;
* **idle-slot loop**: when the *next* request launches, every other idle slot is saved to the RAM cache,
  and cleared on a unified KV (notebook 05). The dashed arrow: the next request starts again at the top."""),
    code("""from slotlab.figures import flow
steps = flow.path(eng, 1)
for k in ("slot", "cache", "n_past", "checkpoint", "prefill", "release"):
    print(f"{k:10s} {steps[k]}")
assert steps["slot"] == "slot 3 by LCP similarity, f_sim 0.625"
assert steps["cache"] == "saved 34 tokens as entry #0; no entry loaded"
assert steps["n_past"] == "common prefix 15 -> cache_n 0" and steps["shift"] == "none"
assert steps["checkpoint"] == "none usable: full re-processing, n_past 0"
assert (steps["prefill"] == "24 tokens prefilled, checkpoints at [20]"
        and steps["release"] == "slot 3 idle with 31 tokens")
flow.image(eng, 1)"""),
    md("""Bob's prompt shares its first 15 tokens with Alice's: the system prompt and `User`. Her slot was
idle, so the server picked it by **LCP similarity** (`f_sim` 15/24 above `-sps 0.10`, spec 1.2). But
keeping the shared 15 tokens would keep less than half of the slot (`f_keep` 15/34 < 0.5, spec 1.4). So the server first **saved Alice's
34 tokens to the RAM cache** (entry #0, with her checkpoint) and looked for a better entry (none).
Then it re-processed Bob's whole prompt: `no usable checkpoint: full re-processing forced`.

The sliding window is not why: the slot held 34 tokens and Gemma 3 270M's window is 512, so nothing had
left it. Bob lost his 15 shared tokens to the server's **checkpoint rule**, which the next section
states and draws once. (The notebooks that follow refer back to it.) First, Alice comes back:"""),
    code("""alice2 = alice1 + (" Assistant: Rotterdam, Hamburg, Antwerp."
                   " User Alice: and which of them is deepest?")
carol = "Translate to German: the weather is lovely today."
r_c = ask(eng, carol, 6); print(summary(r_c))
r_a2 = ask(eng, alice2, 8); print(summary(r_a2))
scores = [f"entry #{s['entry_id']}: {s['n_tokens']} tokens, lcp {s['lcp']}, f_keep "
          f"{s['f_keep']:.3f}, "
          f"f_sim {s['f_sim']:.3f}{'  <- restored' if s['winner'] else ''}"
          for s in event("cache_load_scores", 3).scores]
print("\\n".join(scores))
print(why(eng, 2))
assert r_c["id_slot"] == 2 and r_c["timings"]["prompt_n"] == 11 and r_c["tokens_cached"] == 16
assert (r_a2["id_slot"] == 1 and r_a2["timings"]["cache_n"] == 22
        and r_a2["timings"]["prompt_n"] == 23)
assert r_a2["tokens_evaluated"] == 45 and r_a2["tokens_cached"] == 52
assert scores == ["entry #0: 34 tokens, lcp 27, f_keep 0.794, f_sim 0.600  <- restored",
                  "entry #1: 31 tokens, lcp 15, f_keep 0.484, f_sim 0.333"]
assert ("RAM entry #0 restored (f_keep 0.79, f_sim 0.60 beat baseline -1.00); checkpoint restored "
        "(n_past 22)" in why(eng, 1))
assert "22 tokens reused, 23 prefilled" in why(eng, 1)"""),
    md("""Alice's follow-up went to the least recently used slot (1). That slot was empty, so any entry
above the 0.25 `f_keep` floor beats it. Her old prompt, entry #0, shares 27 tokens with the
follow-up (`f_keep` 27/34, `f_sim` 27/45). It came back into slot 1 with its checkpoint, and the
checkpoint was restored: **22** tokens reused, not 27. (Bob's entry #1 shares only the system prompt.)
The same rule again.

## The checkpoint rule

On a full-attention model (Llama, Mistral, dense Qwen3) this section does not apply: `n_swa` is 0,
the memory can be cut back anywhere, and the common prefix is always reused. Gemma 3, the default
model here, has a sliding window (as do gpt-oss and Gemma 2), and hybrid or recurrent models (Qwen3.5,
Nemotron-H) have a state that cannot be rolled back; for them the server adds one rule.

When a request can reuse the first `pos_next` tokens of what a slot holds (its common prefix), the
server checks whether the memory can continue from there (spec 3.5, `server-context.cpp`):

* `pos_min_thold = max(0, pos_next - n_swa)` (one less when the prompt adds no new token), and
  `pos_min` = the lowest position the slot's memory holds;
* if **`pos_min >= pos_min_thold`**, the cut-back needs a **checkpoint**. The server takes the newest
  one with `pos_max <= pos_next` (and `pos_min < pos_min_thold` or `pos_min == 0`), restores it and
  continues from its end. Without one it logs `forcing full prompt re-processing` and `cache_n` is 0.

On Gemma 3 270M (`n_swa` 512, as on 1B; 1,024 on 4B, 12B and 27B) without `--swa-full`, any
`pos_next <= 512` gives a threshold of 0, and
`pos_min >= 0` always holds. So **every** reuse of a short prompt goes through a checkpoint, even when
nothing has left the window. The server takes checkpoints while it processes a prompt: 4 and
`4 + n_ubatch` tokens before its end, and with chat message delimiters also at user-message starts
(notebook 06). The plain prompts here have no delimiters, so each checkpoint sits 4 tokens before the
end of its prompt, and none sits where the shared system prompt ends.

* Bob: cut back to 15; Alice's only checkpoint ends at 22 (`pos_max 22 > 15`): none fits, so his
  prompt is re-processed in full.
* Alice: cut back to 27; her checkpoint `[0, 22]` fits. The server restores it and re-evaluates from
  its last token, so 22 tokens are reused.

`--swa-full` keeps the whole context in the window cache: a **live** slot can then be cut back
anywhere, and no checkpoint is needed (notebook 04). A slot restored from the RAM cache or a slot file
cannot, `--swa-full` or not: it holds only the window (the section *A restored slot keeps only the
window* below). The picture draws both requests from the engine's events:"""),
    code("""from slotlab.figures import checkpoints
bob, alice = checkpoints.rewind(eng, 1), checkpoints.rewind(eng, 3)
for r in (bob, alice):
    print(r.sentence())
assert (bob.pos_next, bob.pos_min, bob.pos_min_thold, bob.checkpoints, bob.chosen) == (15, 0, 0,
    [(0, 22, 23)], None)
assert (alice.pos_next, alice.pos_min_thold, alice.chosen, alice.n_past) == (27, 0, (0, 22, 23), 22)
assert bob.n_held == 34 and alice.n_held == 34 and eng.memory.info.n_swa == 512
checkpoints.figure(eng, [1, 3])"""),
    md("""## The rule at the scale people run

The prompts above are toys: 24 to 45 tokens, all inside the 512-token window, and plain text with no
message delimiters. There every cut-back needs a checkpoint, and none sits where the users diverge:
Bob reused 0 of the 15 tokens he shared with Alice. Real prompts are longer and come through the chat
endpoint, which renders the messages with the model's chat template and sends the template's message
delimiters with the request (`message_delimiters`, server-context.cpp 4285-4288 at the pin). Two users
of a shop's assistant, each with the same 3,435-token system prompt, on a second engine with the same
defaults, then on the simulator's paper memory with two 27B profiles (`slotlab profiles`):"""),
    code("""from pathlib import Path
import slotlab
from slotlab.memory.profile import ModelProfile
from slotlab.serve.chat import ChatTemplate
from slotlab.sim.paper_replay import paper_engine

model = eng.model
tmpl = ChatTemplate(model)            # this GGUF has no template: the server's fallback, ChatML
DELIMS = tmpl.delimiters()            # what the chat endpoint sends with each request
POLICY = "You are the support assistant of a bicycle shop. " + " ".join(
    f"Policy {i}: item {i} ships within {i % 5 + 1} days, and a return of item {i} needs receipt "
        f"R{1000 + i}."
    for i in range(110))
n_system = len(model.tokenize(tmpl.apply([{"role": "system", "content": POLICY}],
                                         add_generation_prompt=False)))

def two_users(e):
    \"\"\"Ana, then Ben, one question each after the same system prompt: Ben's result and rewind.\"\"\"
    for u in ("Ana", "Ben"):
        msgs = [{"role": "system", "content": POLICY},
                {"role": "user", "content": f"I am {u}. Where is my order 7?"}]
        r = ask(e, tmpl.apply(msgs), 8, message_delimiters=DELIMS)
    k = checkpoints.rewind(e, 1)
    e.close()
    return r, k

PROFILES = Path(slotlab.__file__).parent / "sim" / "profiles"
ben = {"gemma-3-270m (live)": two_users(Engine("-c 8192", model=model))}
for name in ("gemma-3-27b", "qwen3.5-27b"):
    ben[name] = two_users(paper_engine(["-c", "131072"], vocab=model,
        profile=ModelProfile.from_json(PROFILES / f"{name}.json"))[0])
print(f"toy: Bob shares {bob.lcp} tokens with Alice, reuses {r_b1['timings']['cache_n']}")
print(f"chat: system prompt {n_system:,} tokens")
for name, (r, k) in ben.items():
    print(f"  {name:20s} Ben: cache_n {r['timings']['cache_n']:,}, prompt_n "
          f"{r['timings']['prompt_n']}; {k.sentence()}")
(live, k_live), (g27, k_g27), (q27, k_q27) = ben.values()
assert n_system == 3435 and (bob.lcp, r_b1["timings"]["cache_n"]) == (15, 0)
assert (live["timings"]["cache_n"] == g27["timings"]["cache_n"] == k_live.lcp == 3445 > n_system
        and live["timings"]["prompt_n"] == 23)
assert (k_live.chosen is None
        and (k_live.pos_min, k_live.pos_min_thold, k_live.n_held) == (915, 2933, 3475))
# the window cache's 2,560 cells, all written
assert k_live.pos_min == k_live.n_held - (512 * 4 + 512)
assert (k_g27.chosen is None and (k_g27.pos_min, k_g27.pos_min_thold) == (0, 2421)
        and g27["timings"]["prompt_n"] == 23)
assert k_q27.pos_min == 3474 >= k_q27.pos_min_thold == 3445    # one position: the recurrent state's
assert (q27["timings"]["cache_n"] == k_q27.n_past == n_system == 3435 and k_q27.chosen[2] == 3435
        and q27["timings"]["prompt_n"] == 33)"""),
    md("""On the default model Ben reuses 3,445 tokens: the system prompt and his message's first tokens
(`<|im_start|>user` and `I am `), with no checkpoint at all. The rule said a cut-back needs one if
`pos_min >= pos_next - n_swa`; Ana's slot held 3,475 tokens, and the window cache (2,560 cells in this
unified pool of 4 slots: `n_swa * 4 + n_ubatch`) keeps its masked cells until they are overwritten,
so the oldest position it still holds is 915. The threshold, 3,445 − 512 = 2,933, is above it: the
memory can simply be cut back. **A live slot's cut-back needs no checkpoint while it stays within the
window cache's cells beyond the window of the slot's end**; only deeper ones (an edit early in a long
prompt, a branch to an old turn) need a checkpoint. A restored slot has no such cells (next section).

Gemma 3 27B (window 1,024, a 4,608-cell window cache in the same pool) decides the same. Qwen3.5 27B
is hybrid: its recurrent layers cannot be cut back at all, so every reuse goes through a checkpoint.
The chat endpoint's delimiters put one at the start of the user message (n_tokens 3,435, right after
the system prompt), and Ben's request restores it: 3,435 tokens reused, 33 prefilled. Without
delimiters (the toy) Qwen3.5 would find none there. Notebook 07 runs this chat on more users and
flags, and gives what `--swa-full` costs on a 27B model; notebook 08 sizes the RAM cache for 27B
checkpoints."""),
    md("""## A restored slot keeps only the window

Everything above is about a **live** slot: one that holds what it processed itself. A slot that comes
back from the RAM cache (`prompt_load`, notebook 02) or from a slot file (`?action=restore`, notebook
03) holds less. Both save the slot's sequence (`llama_state_seq_get_data_ext`, server-context.cpp:276;
`llama_state_seq_save_file`, 2555), and a KV cache's `state_write` skips every cell the sliding window
masks: `is_masked_swa(n_swa, swa_type, pos, seq_pos_max)` (llama-kv-cache.cpp:2092-2097 at the pin).
So in the window layers only the last `n_swa` positions travel, and the restored slot's `pos_min` is
its end minus `n_swa`.

`--swa-full` does not change what is saved. It sizes the window cache like the full one
(llama-kv-cache-iswa.cpp:76-81), but builds it with the model's `n_swa` all the same (iswa:102-105),
so its cells are still masked and still skipped. It changes the server's side: the server's `n_swa`
becomes 0 (server-context.cpp:1185), so the threshold is `pos_next` itself, and the server takes no
checkpoints (3449-3454). Four cases, each cut back to every 32nd position of Ana's 3,475 tokens on the
paper memory with the default model's own hyperparameters (the same decisions as the live model: the
live slot's `pos_min` is the 915 above):"""),
    code("""import tempfile
from slotlab.figures import png
from slotlab.lab import action

g270 = ModelProfile.from_gguf(model.path)       # the default model's hyperparameters, on paper
files = Path(tempfile.mkdtemp())
ana = tmpl.apply([{"role": "system", "content": POLICY},
                  {"role": "user", "content": "I am Ana. Where is my order 7?"}])
TAIL = model.tokenize(" Thanks.", add_special=False).tolist()
ROWS = {"live slot": ([], False), "restored slot": ([], True),
        "live slot, --swa-full": (["--swa-full"], False),
        "restored slot, --swa-full": (["--swa-full"], True)}

def cut_back(row, cut):
    \"\"\"Ana's slot (live, or saved to a file and restored) cut back to `cut`.\"\"\"
    flags, restored = ROWS[row]
    e, _ = paper_engine(["-c", "8192", "--slot-save-path", str(files), *flags],
                        vocab=model, profile=g270)
    ask(e, ana, 8, id_slot=0, message_delimiters=DELIMS)
    if restored:
        action(e, "save", 0, "ana.bin"); action(e, "erase", 0); action(e, "restore", 0, "ana.bin")
    held, pos_min = e.slots[0].tokens.tolist(), e.memory.pos_min(0)
    r = ask(e, held[:cut] + TAIL, 1, id_slot=0)
    e.close()
    return len(held), pos_min, r["timings"]["cache_n"]

N = cut_back("live slot", 1)[0]
CUTS = list(range(32, N, 32)) + [N]
probe = {row: {c: cut_back(row, c)[2] for c in CUTS} for row in ROWS}
pos_min = {row: cut_back(row, N)[1] for row in ROWS}
first = {}                                       # the lowest cut-back that re-processes nothing
for row, p in probe.items():
    ok = [c for c in CUTS if p[c] == c]
    if ok:
        lo, hi = max([0] + [c for c in CUTS if c < ok[0]]), ok[0]
        while hi - lo > 1:                       # bisect between the grid points
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if cut_back(row, mid)[2] == mid else (mid, hi)
        first[row] = hi
for row in ROWS:
    reach = f"to {first[row]:,} and later" if row in first else "nowhere, not even at its end"
    print(f"{row:26s} window layers hold {pos_min[row]:,} to {N - 1:,}; "
          f"cut back without re-processing: {reach}")
assert (N == k_live.n_held == 3475 and N - 1 == 3474
        and pos_min["live slot"] == k_live.pos_min == 915)
assert pos_min["restored slot"] == pos_min["restored slot, --swa-full"] == N - 512 == 2963
assert pos_min["live slot, --swa-full"] == 0
assert first == {"live slot": 915 + 512 + 1, "live slot, --swa-full": 1,
                 "restored slot, --swa-full": 2963 + 1} == {"live slot": 1428,
                 "live slot, --swa-full": 1, "restored slot, --swa-full": 2964}
assert all(all((n == c) == (c >= first[r]) for c, n in probe[r].items()) for r in first)
# every cut-back re-processed: the file has no checkpoint
assert not any(probe["restored slot"].values())"""),
    code("""from matplotlib.patches import Patch
fig, ax = png.new(9, 2.6)
KEPT, NEED, LOST, WIN = "#4c78a8", "#f58518", "#d62728", "#9467bd"
for y, row in enumerate(ROWS):
    b = first.get(row, N + 1)
    bad = NEED if "swa-full" not in row else LOST
    ax.broken_barh([(0, b - 1)], (y - 0.3, 0.45), color=bad)
    if b <= N:
        ax.broken_barh([(b - 1, N - b + 1)], (y - 0.3, 0.45), color=KEPT)
    ax.broken_barh([(pos_min[row], N - pos_min[row])], (y + 0.2, 0.12), color=WIN)
ax.set_yticks(range(len(ROWS)), list(ROWS))
ax.invert_yaxis()
ax.set_xlim(0, N)
ax.set_xlabel(f"cut back to pos_next (Ana's slot holds {N:,} tokens; Gemma 3 270M, n_swa 512)")
handles = [Patch(color=c) for c in (KEPT, NEED, LOST, WIN)]
ax.legend(handles, ["cut back, nothing re-processed", "needs a checkpoint at or before the cut",
                    "re-processed: --swa-full takes no checkpoints",
                    "cells the window layers hold"],
          loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
ax.set_title("where a slot can be cut back: live or restored, --swa-full off or on", loc="left")
png.image(fig)"""),
    md("""Read it row by row (`N` = the tokens the slot holds):

* **Live slot**: cut back to `pos_next > pos_min + n_swa` (1,428 and later here) with no checkpoint;
  deeper needs one (the server takes them near each prompt's end and at user messages).
* **Restored slot**: its `pos_min` is `N - n_swa`, and the threshold of a cut-back to `pos_next <= N`
  is at most `N - n_swa`: **every** cut-back, even continuing at the very end, needs a checkpoint. A
  stock slot file brings none, so everything is re-processed (notebook 03); a RAM-cache entry brings
  the slot's checkpoints, and the server restores the newest one at or before the cut (notebook 11:
  the reply is processed again). A live slot would have needed none.
* **Live slot, `--swa-full`**: anywhere, no checkpoint (notebook 04).
* **Restored slot, `--swa-full`**: only within the window, `pos_next > N - n_swa` (2,964 and later);
  a deeper cut-back is re-processed in full, and there is no checkpoint to fall back on. Notebook 11
  shows what that costs on gpt-oss (a 128-token window).

The rule in one line: **a restored slot holds the last `n_swa` positions of its window layers, with or
without `--swa-full`.**"""),
    md("""## What the server would report

`/slots` (spec 8.1) and the `/metrics` counters: how many prompt tokens were reused from a slot or the
cache, and how many were processed."""),
    code("""import json
for s in eng.slots_json():
    print(json.dumps({k: s.get(k)
                      for k in ("id", "n_ctx", "is_processing", "id_task", "n_prompt_tokens")}))
m = eng.metrics
print(f"prompt tokens reused {m.prompt_tokens_cached_total}, processed {m.prompt_tokens_total}, "
      f"hit rate {m.hit_rate:.1%}")
assert (m.prompt_tokens_cached_total == sum(r["timings"]["cache_n"]
                                            for r in (r_a1, r_b1, r_c, r_a2)) == 22)
assert m.prompt_tokens_total == 85 and f"{m.hit_rate:.1%}" == "20.6%"
assert ([s["n_ctx"] for s in eng.slots_json()] == [8192] * 4
        and eng.slots_json()[1]["n_prompt_tokens"] == 52)
allocs = [(e.data["entry_id"], e.data["n_tokens"], e.data["id_slot"]) for e in eng.events.log
          if e.kind == "cache_alloc"]
print("RAM cache entries saved so far (entry, tokens, from slot):", allocs)
assert allocs == [(0, 34, 3), (1, 31, 3), (2, 16, 2)]"""),
    md("""Slot 1 holds Alice's 52 tokens, and the other slots hold none. After each launch the server saves
the other idle slots to the RAM cache and clears them (idle-slot caching, spec 1.6). Bob's prompt
(entry #1) and Carol's (entry #2) now live in the cache, and Alice's first prompt (entry #0) left it
when it was restored.

## Live mode
So far every request ran inside the cell that sent it (step mode: deterministic, what nbval checks).
With `eng.start()` the engine runs in a background thread, as the server's main loop does, and the
panel above redraws up to ten times a second while the requests run (scroll up and watch it).
`pause()` before submitting queues the three requests together, so the slot choices do not depend
on timing; `t.wait()` blocks until a request is done."""),
    code("""eng.pause()
eng.start()
users = ["Dmitri: which port is closest to Berlin?", "Erin: are there night ferries to Oslo?",
         "Farah: where can I store luggage?"]
tasks = [eng.submit(SYSTEM + "User " + u, n_predict=48, ignore_eos=True) for u in users]
eng.resume()"""),
    code("""for t in tasks:
    print(summary(t.wait(300)))
eng.stop()
rows = [(t.id, t.result["id_slot"], checkpoints.rewind(eng, t.id)) for t in tasks]
for tid, slot, r in rows:
    print(f"task {tid}, slot {slot}: common prefix {r.lcp} of {r.n_held} held, checkpoints end at "
          f"{[c[1] for c in r.checkpoints]} -> cache_n {r.n_past}")
assert [(t.result["id_slot"], t.result["timings"]["prompt_n"], t.result["tokens_cached"])
        for t in tasks] == \\
    [(1, 24, 71), (0, 24, 71), (3, 23, 70)]                                     # three slots at once
assert [(tid, r.lcp, r.n_held, [c[1] for c in r.checkpoints], r.n_past, r.chosen) for tid, _, r in rows] == [
    (4, 15, 52, [22, 21, 40], 0, None), (5, 15, 31, [19], 0, None), (6, 15, 52, [22, 21, 40], 0, None)]"""),
    md("""Each of the three shares the same 15 tokens (the system prompt and `User`) with what it found: Dmitri with Alice's
conversation in slot 1, Erin and Farah with RAM entries restored into empty slots (Bob's, and Alice's
saved once more). All three got `cache_n` 0, for the same reason as Bob. The cut-back goes to 15, the
threshold is 0, and every checkpoint ends at 19 or later. Only a checkpoint at or before the end of
the shared system prompt would help, and the server takes none there (on chat requests it does take
one at each user-message start: notebook 06). `--swa-full` avoids the rule here, for the live slot and
for the two restored entries alike, because all of them fit in the window; a longer conversation
restored from the RAM cache keeps only its last `n_swa` positions, `--swa-full` or not (the section
*A restored slot keeps only the window*).

## The whole run, as the panel draws it

The panel (live above, as a picture here and in later chapters) draws the engine's state after the last
event. Its parts, top to bottom:

* **the header**: slots, `n_ctx_slot`, `n_swa`, the last event number, the requests done, the flags;
* **plot 1, slot token timelines**: one row per slot, its tokens coloured by where they came from in its
  last request (kept in the slot, loaded from a RAM-cache entry, restored from a checkpoint, prefilled,
  generated...); the red tick is the first token that differed from what the slot held;
* **plot 2, checkpoints**: each checkpoint's recorded `[pos_min, pos_max]`, the grey SWA window (the last
  `n_swa` positions), the slot's `n_past`, and the last checkpoint events (created, restored, erased);
* **plot 3, evictions by reason, over time**: every RAM-cache entry dropped and every slot cleared,
  on its reason's row (`loaded`: an entry went back into a slot; `idle_clear`: the idle-slot loop cleared
  a slot; `make_room`, `byte_limit`, `token_limit`: the cache's limits), at the time it happened
  (seconds since the server started); `x2` beside a mark counts several at once;
* **the RAM-cache strip**: the cache's size against its limits, and its entries, oldest (next evicted)
  first.

The legend lists only what the picture draws. Here: slot 1 holds Dmitri's request (task 4), slot 0
Erin's (task 5), slot 3 Farah's (task 6); the evictions are the entries loaded back into slots and the
slots the idle-slot loop cleared, each at its time."""),
    code("""from collections import Counter
from slotlab.panel.figure import figure_data, legend_entries
from slotlab.panel.static import panel_image, panel_state
pd = figure_data(panel_state(eng))
marks = sorted(zip(pd.evictions.x, pd.evictions.y, pd.evictions.symbol))
one, two = legend_entries(pd)
by_reason = Counter()
for r, n in zip(pd.evictions.y, pd.evictions.symbol):
    by_reason[r] += n  # a mark stands for n evictions of one reason at one moment
print("plot 3, evictions by reason:", sorted(by_reason.items()))
print("legend, plot 1:", [label for _, label in one])
print("legend, plot 2:", [label for _, label in two])
evicted = Counter((round(e.t, 3), e.data["reason"]) for e in eng.events.log
                  if e.kind == "cache_evict" or
                  e.kind == "slot_clear" and e.data["reason"] == "idle_clear"
                  and e.data["n_tokens"] > 0)
# one mark per eviction time and reason
assert marks == sorted((t, r, n) for (t, r), n in evicted.items())
# every eviction counted once
assert by_reason == Counter(r for (_, r), n in evicted.items() for _ in range(n))
assert ([k for k, _ in one] == [k for k in pd.prov
                                if pd.prov[k].x] + ["divergence"] * bool(pd.divergence.x))
panel_image(eng)"""),
    md("""## Try this
1. Re-create the engine with `"-c 8192 -sps 0"` (similarity selection off) and replay the four
   requests: which slots change, and does Alice still reuse her prefix (through the RAM cache)?
2. Add `--swa-full` and replay: how many tokens do Bob and Alice reuse now, and why? Does the RAM
   cache still matter?
3. Use `"-np 2 -c 8192"` (two slots, **not** unified): idle slots keep their KV instead of being saved
   and cleared after each launch. Compare `cache_n` and the event log.
4. Open the panel's *events* tab and filter on `cache_evict`: why was each entry removed?"""),
]
