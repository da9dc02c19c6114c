"""Notebook 01-tour: its cells (markdown and code), written by `notebooks/build_notebooks.py 01-tour`."""

from course.cells import code, md

NAME = "01-tour"

CELLS = [
    md("""# 01 · A tour of llama-server's slots, on a live model

`llama-server` keeps one **slot** per parallel sequence (`-np`, default *auto* = 4 slots sharing one
**unified** KV pool). For every request it picks a slot, decides how much of the prompt it can reuse
(`cache_n`) and prefills the rest (`prompt_n`); between requests a **RAM prompt cache**
(`--cache-ram`, 8192 MiB by default) keeps prompts that slots had to give up. slotlab runs exactly
that machinery on a real `llama_context` (Gemma 3 270M), and this notebook walks through it with the
server's defaults. Every number printed below is also asserted."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, why
from slotlab.panel import Panel

eng = Engine("-c 8192")          # the server's defaults, a smaller context to stay quick
print(eng.slots_json()[0] | {"n_slots": len(eng.slots)})
assert len(eng.slots) == 4 and eng.ctx.kv_unified"""),
    md("""The panel shows every slot's tokens coloured by where they came from, the checkpoint chain, the
RAM cache with each entry's `f_keep` / `f_sim`, the event log and a plain-words *why* per request.
(Run the cells below and watch it; in step mode it redraws when a cell finishes.)"""),
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
assert r_a1["id_slot"] == 3 and r_a1["timings"]["cache_n"] == 0
assert r_b1["id_slot"] == 3 and r_b1["timings"]["cache_n"] == 0"""),
    md("""Bob's request shares the system prompt with Alice's, and Alice's slot was idle, so the server picked
it by **LCP similarity** (`f_sim` above `-sps 0.10`). But keeping only the shared 15 tokens would
lose most of Alice's slot (`f_keep < 0.5`), so her prompt was first **saved to the RAM cache**. And
Gemma 3 slides its attention window: without `--swa-full` the slot cannot be cut back to position 15
unless a checkpoint ends there, so the server re-processed Bob's prompt from scratch (`cache_n` 0).
The engine's *why* lines say exactly that:"""),
    code("""print(why(eng))"""),
    code("""alice2 = alice1 + " Assistant: Rotterdam, Hamburg, Antwerp. User Alice: and which of them is deepest?"
carol = "Translate to German: the weather is lovely today."
r_c = ask(eng, carol, 6); print(summary(r_c))
r_a2 = ask(eng, alice2, 8); print(summary(r_a2))
print(why(eng, 2))
assert r_a2["timings"]["cache_n"] > 0   # Alice's conversation came back from the RAM cache"""),
    md("""Alice's follow-up found her old prompt in the RAM cache (the best `f_keep` / `f_sim`), restored it
into a free slot and then restored the context checkpoint that came with it: 22 tokens reused."""),
    md("""## What the server would report

`/slots` (spec 8.1) and the `/metrics` counters: how many prompt tokens were reused from a slot or the
cache, and how many were processed."""),
    code("""import json
for s in eng.slots_json():
    print(json.dumps({k: s.get(k) for k in ("id", "n_ctx", "is_processing", "id_task", "n_prompt_tokens")}))
m = eng.metrics
print(f"prompt tokens reused {m.prompt_tokens_cached_total}, processed {m.prompt_tokens_total}, hit rate {m.hit_rate:.1%}")
assert m.prompt_tokens_cached_total == sum(r["timings"]["cache_n"] for r in (r_a1, r_b1, r_c, r_a2))"""),
    md("""## Live mode
So far every request ran inside the cell that sent it (step mode: deterministic, what nbval checks).
With `eng.start()` the engine runs in a background thread, as the server's main loop does, and the
panel above redraws up to ten times a second while the requests run (scroll up and watch it).
`pause()` before submitting queues the three requests together, so the slot choices do not depend
on timing; `t.wait()` blocks until a request is done."""),
    code("""eng.pause()
eng.start()
users = ["Dmitri: which port is closest to Berlin?", "Erin: are there night ferries to Oslo?", "Farah: where can I store luggage?"]
tasks = [eng.submit(SYSTEM + "User " + u, n_predict=48, ignore_eos=True) for u in users]
eng.resume()"""),
    code("""for t in tasks:
    print(summary(t.wait(300)))
eng.stop()
assert sorted(t.result["id_slot"] for t in tasks) == sorted(set(t.result["id_slot"] for t in tasks))  # three slots at once"""),
    md("""## Try this
1. Re-create the engine with `"-c 8192 -sps 0"` (similarity selection off) and replay the four
   requests: which slots change, and does Alice still reuse her prefix (through the RAM cache)?
2. Use `"-np 2 -c 8192"` (two slots, **not** unified): idle slots keep their KV instead of being saved
   and cleared after each launch. Compare `cache_n` and the event log.
3. Open the panel's *events* tab and filter on `cache_evict`: why was each entry removed?"""),
]
