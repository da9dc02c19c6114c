"""Notebook 04-cache-reuse-shifting: its cells (markdown and code), written by `notebooks/build_notebooks.py 04-cache-reuse-shifting`."""

from course.cells import code, md

NAME = "04-cache-reuse-shifting"

CELLS = [
    md("""# 04 · `--cache-reuse`: shifting KV chunks instead of recomputing them

After the common prefix, llama-server looks for chunks of the slot's old tokens that reappear later in
the new prompt (at least `--cache-reuse N` tokens long; the default, 0, turns this off). It deletes what lies in between and **shifts**
each chunk down with `llama_memory_seq_add` (spec 3.4). The llama.cpp docs illustrate it with letters:
cache `AAABCCCC`, new prompt `AAACCCC` → keep `AAA`, drop `B`, shift `CCCC` left. Below, `A`, `B` and
`C` are three blocks of numbered sentences.

**Defaults in this chapter.** The server's: `--cache-reuse 0` (off; a request may set `n_cache_reuse`),
no `--swa-full`. Here: `-np 1 -c 4096 --swa-full --cache-reuse 16` first (a full-size cache: a live
slot can be cut back and shifted anywhere), then the same without `--swa-full`, where the sliding
window stops both."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary
block = lambda word, n: " ".join(f"{word} {i}." for i in range(n))
A, B, C = block("alpha", 20), block("bravo", 20), block("charlie", 40)
eng = Engine("-np 1 -c 4096 --swa-full --cache-reuse 16")
r0 = ask(eng, f"{A} {B} {C}", 2); print(summary(r0))
r = ask(eng, f"{A} {C}", 2); print(summary(r))
for e in eng.events.filter(["cache_reuse_shift"]):
    print(e.message)
shifts = eng.slots[0].shifts
assert (r0["timings"]["prompt_n"], r0["tokens_evaluated"], r0["tokens_cached"]) == (411, 411, 412)
assert (r["timings"]["cache_n"], r["timings"]["prompt_n"], r["tokens_evaluated"],
        r["tokens_cached"]) == (320, 1, 321, 322)
assert shifts == [(181, 411, 91, 321)]
(a, b, c, d), = shifts
old, new = eng.tokenize(f"{A} {B} {C}"), eng.tokenize(f"{A} {C}")
assert list(old[a:b]) == list(new[c:d]) and b - a == d - c == 230   # the same 230 tokens (C), moved
# C ends the prompt; it moved down by B's length
assert d == len(new) and a - c == len(old) - len(new)"""),
    md("""`cache_n` now counts the common prefix **and** the shifted chunk: only the tokens after it are
prefilled. The strip below shows the slot before the request and the new prompt. The common prefix
`[0, 91)` (`A`) is kept. The cells `[91, 181)` (`B`) are removed with `seq_rm`. The chunk `[181, 411)`
(`C`, 230 tokens) moves 90 positions down to `[91, 321)`, and the generated token at 411 is dropped. That
covers all 321 prompt tokens. The server evaluates at least one token per request (spec 3.6), so
`n_past` goes back to 320 and the last shifted token is prefilled again. The move `[a, b) -> [c, d)`
always goes to lower positions, because the prompt cursor never passes the cache cursor."""),
    code("""from slotlab.figures import token_strip
from slotlab.figures.checkpoints import rewind
p = rewind(eng, 1)
print(f"slot held {p.n_held}, common prefix {p.lcp}, shifts {p.shifts}, n_past {p.n_past} of "
      f"{p.n_prompt}")
assert (p.n_held, p.lcp, p.shifts, p.n_past, p.n_prompt) == (412, 91, [(181, 411, 91, 321)], 320,
    321)
assert token_strip.segments(p) == ([(0, 91, "kept"), (91, 181, "dropped"), (181, 411, "chunk"),
                                    (411, 412, "dropped")],
                                   [(0, 91, "kept"), (91, 320, "shifted"), (320, 321, "prefill")])
token_strip.figure(eng, 1,
                   title="AAABCCCC -> AAACCCC: A kept, B dropped, C shifted 90 positions down")"""),
    md("""## Why Gemma 3 needs `--swa-full`
Gemma 3 uses sliding-window attention (a 512-token window on 270M, the model here, and 1B; 1,024 on
4B, 12B and 27B). Without `--swa-full` its window cache holds `n_swa` cells a slot plus a batch (here
512 + 512), fewer than the full-attention cache, so it cannot be shifted (`llama_memory_can_shift`
is false). The server checks
that **once, at load**: `--cache-reuse N` on a context that cannot shift is switched off with a
warning (`server-context.cpp`, `load_model`: `cache_reuse is not supported by this context, it will be
disabled`), so requests get `n_cache_reuse` 0 by default. Only a request that sets `n_cache_reuse`
itself meets the second, per-request warning. Both, on slotlab's engine with the server's texts:"""),
    code("""eng2 = Engine("-np 1 -c 4096 --cache-reuse 16", model=eng.model)
print("can_shift:", eng2.ctx.can_shift)
print("at load:", [e.message for e in eng2.events.log if e.kind == "params"])
# task 0: n_cache_reuse from the server: 0
ask(eng2, f"{A} {B} {C}", 2)
r2 = ask(eng2, f"{A} {C}", 2, n_cache_reuse=16); print(summary(r2))  # task 1 asks for reuse itself
unsupported = [(e.task, e.message) for e in eng2.events.log if e.kind == "cache_reuse_unsupported"]
print("per request:", unsupported)
assert not eng2.ctx.can_shift and not eng2.slots[0].shifts
assert [e.message for e in eng2.events.log if e.kind == "params"] == \\
    ["cache_reuse is not supported by this context, it will be disabled"]
assert eng2.tasks[0].params.n_cache_reuse == 0 and eng2.tasks[1].params.n_cache_reuse == 16
# task 0 asked for none
assert unsupported == [(1, "cache reuse is not supported - ignoring n_cache_reuse = 16")]
assert (r2["timings"]["cache_n"], r2["timings"]["prompt_n"], r2["tokens_evaluated"],
        r2["tokens_cached"]) == (0, 321, 321, 322)"""),
    md("""`cache_n` is 0: not even the 91 tokens of `A`, which the prompt shares at the start, are reused.
Skipping the shift does not explain that. The cause is the [checkpoint rule](01-tour.ipynb#The-checkpoint-rule)
of notebook 01. Keeping `A` means cutting the slot back to `pos_next` 91. With `n_swa` 512 the
threshold `max(0, 91 - 512)` is 0, so the cut needs a checkpoint that ends at or before 91. The server
took the slot's only checkpoint 4 tokens before the end of the 411-token prompt, at `pos_max` 406. None
fits, and the whole prompt is re-processed:"""),
    code("""from slotlab.figures import checkpoints
k = checkpoints.rewind(eng2, 1)
print(k.sentence())
assert (k.lcp, k.pos_next, k.pos_min, k.pos_min_thold, k.checkpoints, k.chosen, k.n_past) == \\
    (91, 91, 0, 0, [(0, 406, 407)], None, 0)
assert k.n_held == 412 and eng2.memory.info.n_swa == 512
checkpoints.figure(eng2, [1])"""),
    md("""With `--swa-full` the window cache spans the whole context: `n_swa` counts as 0, the threshold is
`pos_next` itself, and a live slot can be cut back anywhere without a checkpoint. That is why the first
engine kept `A` *and* could shift `C`. A slot restored from the RAM cache or a slot file is another
matter: its window layers hold only the last `n_swa` positions, `--swa-full` or not, so it cannot be
cut back deeper than that ([notebook 01](01-tour.ipynb#A-restored-slot-keeps-only-the-window)).

Other contexts cannot shift either, with the same two warnings: models with **M-RoPE** (several
positions per token: Qwen2-VL, Qwen3-VL, and Qwen3.5, whose `llama_kv_cache::get_can_shift` returns
false for `n_pos_per_embd() > 1`; a hybrid memory can shift only if its attention part can), and any
server started with a **multimodal projector** (`--mmproj`), which switches `--cache-reuse` off at load
(`cache_reuse is not supported by multimodal`). Recurrent state alone would shift; what Qwen3.5 lacks
is the shift of its M-RoPE attention cache (notebook 09 prints its `can_shift False`), and `--swa-full`
cannot give it that.

## What it saves
Same two requests with and without `--cache-reuse`, on `--swa-full`:"""),
    code("""eng3 = Engine("-np 1 -c 4096 --swa-full", model=eng.model)
ask(eng3, f"{A} {B} {C}", 2)
r3 = ask(eng3, f"{A} {C}", 2)
saved = r3["timings"]["prompt_n"] - r["timings"]["prompt_n"]
print(f"prefill without reuse: {r3['timings']['prompt_n']} tokens, with reuse: "
      f"{r['timings']['prompt_n']} -> {saved} tokens saved")
assert r3["timings"]["cache_n"] == 91 and r3["timings"]["prompt_n"] == 230 and saved == 229"""),
    md("""## Try this
1. Insert a chunk instead of deleting one (`A C` then `A B C`): nothing can be shifted up.
2. Raise `--cache-reuse` above the chunk length: the chunk is no longer reused.
3. Set `n_cache_reuse=0` on one request to turn it off per request.

Next in the reading order: [06 · Context checkpoints](06-checkpoints.ipynb), the sliding window's rule in full."""),
]
