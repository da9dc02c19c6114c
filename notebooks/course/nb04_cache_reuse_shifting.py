"""Notebook 04-cache-reuse-shifting: its cells (markdown and code), written by `notebooks/build_notebooks.py 04-cache-reuse-shifting`."""

from course.cells import code, md

NAME = "04-cache-reuse-shifting"

CELLS = [
    md("""# 04 · `--cache-reuse`: shifting KV chunks instead of recomputing them

After the common prefix, llama-server looks for chunks of the slot's old tokens that reappear later in
the new prompt (at least `--cache-reuse N` tokens long), deletes what is in between and **shifts** the
chunk down with `llama_memory_seq_add` (spec 3.4). The llama.cpp docs illustrate it with letters:
cache `AAABCCCC`, new prompt `AAACCCC` → keep `AAA`, drop `B`, shift `CCCC` left."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary
block = lambda word, n: " ".join(f"{word} {i}." for i in range(n))
A, B, C = block("alpha", 20), block("bravo", 20), block("charlie", 40)
eng = Engine("-np 1 -c 4096 --swa-full --cache-reuse 16")
print(summary(ask(eng, f"{A} {B} {C}", 2)))
r = ask(eng, f"{A} {C}", 2); print(summary(r))
for e in eng.events.filter(["cache_reuse_shift"]):
    print(e.message)
shifts = eng.slots[0].shifts
assert len(shifts) == 1 and r["timings"]["cache_n"] > len(eng.model.tokenize(A))"""),
    md("""`cache_n` now counts the common prefix **and** the shifted chunk: only the tokens after it are
prefilled. The move `[a, b) -> [c, d)` always goes to lower positions: the prompt cursor never passes
the cache cursor.

## Why Gemma 3 needs `--swa-full`
Gemma 3 uses sliding-window attention; without `--swa-full` its SWA cache only holds the last 512
positions plus a batch, so it cannot be shifted (`llama_memory_can_shift` is false). The server then
ignores `n_cache_reuse` with a warning:"""),
    code("""eng2 = Engine("-np 1 -c 4096 --cache-reuse 16", model=eng.model)
print("can_shift:", eng2.ctx.can_shift)
ask(eng2, f"{A} {B} {C}", 2)
r2 = ask(eng2, f"{A} {C}", 2, n_cache_reuse=16); print(summary(r2))
print([e.message for e in eng2.events.log if e.kind == "cache_reuse_unsupported"])
assert not eng2.ctx.can_shift and not eng2.slots[0].shifts"""),
    md("""## What it saves
Same two requests with and without `--cache-reuse`, on `--swa-full`:"""),
    code("""eng3 = Engine("-np 1 -c 4096 --swa-full", model=eng.model)
ask(eng3, f"{A} {B} {C}", 2)
r3 = ask(eng3, f"{A} {C}", 2)
saved = r3["timings"]["prompt_n"] - r["timings"]["prompt_n"]
print(f"prefill without reuse: {r3['timings']['prompt_n']} tokens, with reuse: {r['timings']['prompt_n']} -> {saved} tokens saved")
assert saved > 0"""),
    md("""## Try this
1. Insert a chunk instead of deleting one (`A C` then `A B C`): nothing can be shifted up.
2. Raise `--cache-reuse` above the chunk length: the chunk is no longer reused.
3. Set `n_cache_reuse=0` on one request to turn it off per request."""),
]
