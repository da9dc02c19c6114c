"""Notebook 05-idle-slots: its cells (markdown and code), written by `notebooks/build_notebooks.py 05-idle-slots`."""

from course.cells import code, md

NAME = "05-idle-slots"

CELLS = [
    md("""# 05 · Idle slots: saved, cleared, purged (`--cache-idle-slots`, unified KV)

With the server's defaults (auto `-np` → 4 slots and a **unified** KV pool), every launch saves the
*other* idle slots to the RAM cache and clears them (spec 1.6): their cells go back to the shared pool.
A conversation then continues through the RAM cache, possibly in another slot. Without a unified pool
(`-np N` alone) idle slots keep their KV."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, why
doc = lambda topic, n: " ".join(f"Note {i} on {topic}: item {i*7} is on shelf {i % 5}." for i in range(n))
uni = Engine("-np 2 -kvu -c 4096 --swa-full")
for p in (doc("rivers", 6), doc("caves", 6), doc("rivers", 6) + " More?"):
    print(summary(ask(uni, p, 3)))
print(why(uni, 3))
print("slot tokens after the run:", [len(s.tokens) for s in uni.slots])"""),
    md("""The `rivers` conversation started in slot 1, was saved and cleared when `caves` launched, and came
back through a RAM-cache **load** into whichever slot LRU picked. Non-unified, the same traffic:"""),
    code("""sep = Engine("-np 2 -c 4096 --swa-full", model=uni.model)
res = [ask(sep, p, 3) for p in (doc("rivers", 6), doc("caves", 6), doc("rivers", 6) + " More?")]
for r in res: print(summary(r))
print("slot tokens after the run:", [len(s.tokens) for s in sep.slots])
assert res[2]["id_slot"] == res[0]["id_slot"] and all(len(s.tokens) for s in sep.slots)"""),
    md("""## KV pressure: `try_clear_idle_slots` and batch halving
In a unified pool a decode can fail for lack of free cells even though the slot is under its `n_ctx`.
The server then purges the first idle slot that holds tokens (not saved!) and retries; only when
nothing can be purged does it halve the batch (spec 6.2, 6.3)."""),
    code("""tight = Engine("-np 2 -kvu -c 1024 -b 512 --no-cache-idle-slots --swa-full", model=uni.model)
print(summary(ask(tight, doc("volcanoes", 40), 2)))
print(summary(ask(tight, doc("beekeeping", 26), 2)))
for e in tight.events.log:
    if e.kind in ("slot_purge", "decode_retry"):
        print(e.message)
assert any(e.kind == "slot_purge" for e in tight.events.log)"""),
    md("""## Try this
1. Run the unified example with `--no-cache-idle-slots`: the `rivers` slot keeps its KV until a purge.
2. Send two long prompts at once (`submit` both, then `run_until_idle`) in the tight pool: nothing idle
   can be purged, so the batch is halved — find the `retrying with smaller batch size` lines.
3. Add `--kv-unified-per-slot 512`: how does it change `n_ctx_slot`?"""),
]
