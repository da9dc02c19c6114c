"""Notebook 05-idle-slots: its cells (markdown and code), written by `notebooks/build_notebooks.py 05-idle-slots`."""

from course.cells import code, md

NAME = "05-idle-slots"

CELLS = [
    md("""# 05 · Idle slots: saved, cleared, purged (`--cache-idle-slots`, unified KV)

Right after a request is launched into a slot, the server offers every *other* idle slot to the RAM
cache (`--cache-idle-slots`, on by default; spec 1.6: `saving idle slot to prompt cache`). What happens
to the slot next depends on the KV layout:
* **unified** (`-kvu`, and the default: auto `-np` → 4 slots with one shared KV pool): the idle slot is
  also **cleared**, so its cells go back to the pool. A conversation then continues through the RAM
  cache, possibly in **another slot**;
* **not unified** (`-np N` alone): the idle slot keeps its KV, and is **copied** into the RAM cache all
  the same (a copy already there is not stored twice).

Both need a RAM cache: `--cache-ram 0` turns idle-slot caching off too (`--cache-idle-slots requires
--cache-ram, disabling`).

**Defaults in this chapter.** The server's: `--cache-idle-slots` on, `--cache-ram 8192`, `-np` auto
(`4` slots with unified KV; an explicit `-np N` leaves `--kv-unified` off). Here: `-np 2` with and
without `-kvu`, a tight `-c 1024` pool at the end, and `--swa-full` on every engine, so no checkpoint
is needed (06 takes them on). The conversations that travel through the RAM cache here are about 100
tokens, inside the 512-token window; a longer one would come back with only its last 512 positions in
the window layers, `--swa-full` or not ([notebook 01](01-tour.ipynb#A-restored-slot-keeps-only-the-window)).
Read it right after 02.

## A conversation migrates: slot 1 → RAM entry → slot 0
Three conversations, two slots, then the first conversation's next turn:"""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, why
from slotlab.figures.migration import migration_image, migrations, timeline
doc = lambda topic, n: " ".join(f"Note {i} on {topic}: item {i*7} is on shelf {i % 5}."
                                for i in range(n))
prompts = [doc("rivers", 6), doc("caves", 6), doc("lakes", 6), doc("rivers", 6) + " More?"]
names = {0: "rivers", 1: "caves", 2: "lakes"}  # task id -> conversation, for the picture
uni = Engine("-np 2 -kvu -c 4096 --swa-full")
res = [ask(uni, p, 3) for p in prompts]
for r in res: print(summary(r))
print(why(uni, 4))
log = [e.message for e in uni.events.log
       if e.kind == "cache_load_found" or e.kind == "slot_clear" and e.data["n_tokens"] > 0]
print(*log, sep="\\n")
moves = migrations(timeline(uni, names))
print("migrations (conversation, from slot, RAM entry, to slot):", moves)
assert [r["id_slot"] for r in res] == [1, 0, 1, 0]
assert [(r["timings"]["cache_n"], r["timings"]["prompt_n"], r["tokens_cached"]) for r in res] == [
    (0, 95, 97), (0, 95, 97), (0, 95, 97), (95, 2, 99)]
assert ("RAM entry #0 restored (f_keep 0.98, f_sim 0.98 beat baseline -1.00); 95 tokens reused" in why(uni, 1))
assert log == ["clearing prompt with 97 tokens"] * 2 + [" - found better prompt with f_keep = "
    "0.979, f_sim = 0.979",
                                                      "clearing prompt with 97 tokens"]
assert moves == [("rivers", 1, 0, 0)]"""),
    md("""What happened, launch by launch (the picture below draws it from the same events):
1. `rivers` lands in slot 1: both slots are fresh (`t_last = -1`) and LRU takes the **highest** id among
   equal timestamps (spec 1.3).
2. `caves` lands in slot 0 (LRU). Right after its launch the idle slot 1 is saved to the RAM cache as
   entry #0 and, the pool being unified, **cleared** (`clearing prompt with 97 tokens`).
3. `lakes` lands in slot 1 (released before slot 0); slot 0 (`caves`) is saved as entry #1 and cleared.
4. `rivers` returns. No slot holds it, so LRU picks slot 0 (released before slot 1). Selection by LRU
   always consults the RAM cache (spec 1.4): the empty slot's baseline is `f_keep -1.00`, and entry #0
   beats it on both axes (`found better prompt with f_keep = 0.979, f_sim = 0.979`): it is restored into
   **slot 0** and removed from the cache. 95 of the 97 prompt tokens are reused, in another slot than
   the one the conversation started in."""),
    code("""migration_image(uni, names,
                title="unified KV (-np 2 -kvu): rivers moves from slot 1 to slot 0 through RAM "
                "entry #0")"""),
    md("""## Not unified: idle slots are kept *and* copied
The same four requests with separate KV per slot (`-np 2` alone), and then with `--cache-ram 0`:"""),
    code("""sep = Engine("-np 2 -c 4096 --swa-full", model=uni.model)
off = Engine("-np 2 -c 4096 --swa-full --cache-ram 0", model=uni.model)
out = {}
for name, eng in (("-np 2", sep), ("-np 2 --cache-ram 0", off)):
    rs = [ask(eng, p, 3) for p in prompts]
    idle = sum(e.kind == "idle_slot_saved" for e in eng.events.log)
    out[name] = ([r["id_slot"] for r in rs], [r["timings"]["cache_n"] for r in rs], idle,
                 migrations(timeline(eng, names)), [len(s.tokens) for s in eng.slots])
    print(f"{name:20s} slots {out[name][0]}  cache_n {out[name][1]}  idle-slot saves {idle}  "
          f"migrations {out[name][3]}  slot tokens after {out[name][4]}")
print([e.message for e in off.events.log if e.kind == "params"])
assert out["-np 2"] == ([1, 0, 1, 0], [0, 0, 5, 95], 3, [("rivers", 1, 0, 0)], [99, 97])
assert out["-np 2 --cache-ram 0"] == ([1, 0, 1, 0], [0, 0, 5, 5], 0, [], [99, 97])"""),
    md("""* Not unified, nothing is cleared (both slots hold tokens at the end), but each launch still copied the
  other idle slot into the RAM cache: three idle-slot saves. That copy is what saves `rivers` here:
  `lakes` overwrote slot 1 (chosen by LRU, its `f_sim` with `rivers` far below `-sps` 0.10), and `rivers`
  comes back from entry #0 into slot 0 (`cache_n` 95) — the same migration as in the unified pool.
* With `--cache-ram 0` there is no RAM cache, hence no idle-slot caching either: `rivers`' second turn
  reuses only the 5 tokens it shares with `caves` (`<bos>Note 0 on`) and processes the rest again.

With separate slots a conversation stays in its slot only as long as no other request is sent there:
when no slot's similarity is above `-sps`, LRU sends the new request to the slot released longest ago,
whoever it belonged to (notebook 07 shows it on a multi-user trace)."""),
    code("""migration_image(sep, names,
                title="not unified (-np 2): idle slots are copied to the RAM cache and kept")"""),
    md("""## KV pressure: `try_clear_idle_slots` and the retry line
In a unified pool a decode can fail for lack of free cells even though the slot is under its `n_ctx`.
The server then purges the first idle slot that holds tokens (not saved to the RAM cache!) and retries;
only when nothing can be purged does it halve the batch (spec 6.2, 6.3). Here `--no-cache-idle-slots`
leaves `volcanoes` in slot 1, and `beekeeping` does not fit next to it in the 1024-cell pool:"""),
    code("""tight = Engine("-np 2 -kvu -c 1024 -b 512 --no-cache-idle-slots --swa-full", model=uni.model)
r1 = ask(tight, doc("volcanoes", 40), 2)
r2 = ask(tight, doc("beekeeping", 26), 2)
print(summary(r1)); print(summary(r2))
lines = [e for e in tight.events.log if e.kind in ("slot_purge", "decode_retry")]
for e in lines:
    print(e.message)
assert (r1["id_slot"], r1["timings"]["prompt_n"], r1["tokens_cached"]) == (1, 694, 695)
assert (r2["id_slot"], r2["timings"]["prompt_n"], r2["tokens_cached"]) == (0, 468, 469)
# the unified pool: volcanoes' cells plus beekeeping's prompt do not fit in it
n_pool = tight.ctx.n_ctx
assert (r1["tokens_cached"] + r2["timings"]["prompt_n"] > n_pool >= max(r1["tokens_cached"],
    r2["tokens_cached"]))
assert [e.kind for e in lines] == ["slot_purge", "decode_retry"]
assert lines[0].data["id_slot"] == 1 and lines[0].data["n_tokens"] == 695
assert lines[1].data["n_batch"] == 512 and lines[1].data["off"] == 0 and lines[1].data["ret"] == 1
assert tight.cache_json()["entries"] == []   # nothing was saved: the purged conversation is gone"""),
    md("""Read the two lines together: they are one turn of the server's retry loop (spec 6.3). The decode of
`beekeeping`'s prompt returned `ret = 1` (no free KV cells); `try_clear_idle_slots` purged slot 1 (the
first idle slot holding tokens, **not** saved to the RAM cache first); because a slot was purged the batch
was **not** halved — yet the server prints the same `failed to find free space in the KV cache, retrying
with smaller batch size` warning, with the unchanged `n_batch = 512` (the `-b` value). The text is
printed on both paths; only the number tells them apart: a real halving would print `n_batch = 256`.
slotlab prints it as the server does. The panel's picture of this run (the purge is among the evictions):"""),
    code("""from slotlab.panel.static import panel_image
panel_image(tight)"""),
    md("""## Try this
1. Run the unified example with `--no-cache-idle-slots`: the `rivers` slot keeps its KV until a purge —
   does `rivers` still migrate?
2. Send two long prompts at once (`submit` both, then `run_until_idle`) in the tight pool: nothing idle
   can be purged, so the batch is halved — find the `retrying with smaller batch size` lines and their
   `n_batch`.
3. Add `--kv-unified-per-slot 512`: how does it change `n_ctx_slot`?

Next in the reading order: [04 · `--cache-reuse`](04-cache-reuse-shifting.ipynb)."""),
]
