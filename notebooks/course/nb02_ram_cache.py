"""Notebook 02-ram-cache: its cells (markdown and code), written by `notebooks/build_notebooks.py 02-ram-cache`."""

from course.cells import code, md

NAME = "02-ram-cache"

CELLS = [
    md("""# 02 · The RAM prompt cache (`--cache-ram`)

When a slot is about to lose most of what it holds, llama-server saves the slot's sequence state
(`llama_state_seq_get_data_ext`) into a RAM cache, and a later request can restore it into any slot.
The policy (spec section 2) is small and exact; slotlab keeps it pure (`slotlab.engine.prompt_cache`)
so each rule can be shown on its own with synthetic prompts, then on the live model.

The synthetic prompts below are token ranges, and each is given a state size of **16 KiB per token**
(a round figure of the same order as a small model's KV), so the server's log lines print sizes you
can follow in MiB under a 4 MiB budget (`--cache-ram 4`).

**Defaults in this chapter.** The server's: `--cache-ram 8192` (MiB; `0` turns the cache off, `-1`
lifts the byte limit but keeps the cap of `n_ctx` tokens), `-sps 0.10`, `--cache-idle-slots` on, `-np`
auto (`4` slots, unified KV). Here: a `--cache-ram 4` budget so the sizes stay legible, and on the live
model `-np 1 -c 2048 --swa-full -sps 0`: one slot, a full-size attention cache (no checkpoints yet:
notebook 06 brings them; the documents here are 101 tokens, inside the 512-token window, so an entry
restored from the cache holds all of it, which a longer one would not: notebook 01), and no similarity
selection, so every request takes the slot by LRU, which
always saves and loads through the cache (spec 1.3-1.4)."""),
    code("""import numpy as np
from slotlab.engine.prompt_cache import PromptCache
from slotlab.figures import cache_fifo, cache_scores
from slotlab.units import MIB

lines = []
def log(kind, **f):
    if f.get("message"):          # the server's own log line for each decision
        lines.append(f["message"])
        print(f["message"])

PER_TOKEN = 16 * 1024             # bytes of state per token (synthetic)
# --cache-ram 4, n_ctx 4096
cache = PromptCache(limit_size=4 * 1024 * 1024, limit_tokens=4096, on_event=log)
rec = cache_fifo.Recorder(cache)  # remembers the entries after each step, for the picture
toks = lambda *r: np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in r])
# a slot's save: its tokens and state size
save = lambda t: cache.alloc(t, [], PER_TOKEN * len(t))"""),
    md("""## `alloc`: dedupe, over-limit skip, obsolete prefix, make room
Rules run in this order (spec 2.3): (1) a prompt that is a prefix of a cached one is skipped;
(3) a single entry larger than the whole budget is skipped *before* anything is evicted; (4) cached
prompts that are a prefix of the new one are removed as obsolete; (5) the oldest entries are evicted
until the new one fits. Each step prints the server's lines (`prompt_save`, `alloc`)."""),
    code("""a = save(toks((0, 100)));      rec.snap("a: 100 tokens")           # 1.5625 MiB
b = save(toks((0, 50)));       rec.snap("b: a's first 50")        # a prefix of a: already cached
c = save(toks((500, 800)));    rec.snap("c: 300 tokens")          # 4.6875 MiB > 4 MiB: skipped
d = save(toks((0, 160)));      rec.snap("d: a + 60 tokens")       # extends a: a is obsolete
e = save(toks((900, 980)));    rec.snap("e: 80 tokens")
# 2.5 + 1.25 + 1.5625 > 4: the oldest goes
f = save(toks((2000, 2100)));  rec.snap("f: 100 tokens")
print([(x.n_tokens(), x.size()) for x in cache.entries], cache.size(), "bytes")
assert b is None and c is None
assert ([int(x.split()[5].rstrip(",")) for x in lines if "saving prompt" in x] == [100, 50, 300,
    160, 80, 100])
assert " - prompt is already in the cache, skipping" in lines
assert " - prompt state size 4.688 MiB exceeds cache size limit 4.000 MiB, skipping" in lines
assert " - removing obsolete cached prompt with length 100" in lines
assert " - making room for prompt cache entry, removing oldest entry (size = 2.500 MiB)" in lines
assert [(x.n_tokens(), x.size()) for x in cache.entries] == [(80, 1310720), (100, 1638400)]
assert cache.size() == 2949120 == 180 * PER_TOKEN"""),
    md("""## The 40 % shrink
If allocating the buffers fails (`std::bad_alloc`), the server permanently lowers the byte limit to
40 % of what the cache holds. slotlab makes that failure injectable. Here `g` (120 tokens, 1.875 MiB)
first makes room (the oldest entry, `e`, goes), then the allocation fails: the limit becomes 40 % of
the 1.5625 MiB left (0.625 MiB), and `update()` evicts `f` to fit it. Nothing removed comes back."""),
    code("""def failing(n):
    raise MemoryError("injected")
cache.allocate = failing
g = save(toks((3000, 3120)));  rec.snap("g: 120 tokens, alloc fails")
cache.allocate = lambda n: np.zeros(n, dtype=np.uint8)
print("limit now", cache.limit_size, "bytes,", len(cache), "entries")
assert g is None and cache.limit_size == int(0.4 * 100 * PER_TOKEN) == 655360 and len(cache) == 0
assert (lines[-6] == " - saving prompt with length 120, total state size = 1.875 MiB (draft: 0.000 "
        "MiB)")
assert lines[-3:] == [" - cache size limit reduced to 0.625 MiB",
                      " - cache size limit reached, removing oldest entry (size = 1.562 MiB)",
                      " - cache state: 0 prompts, 0.000 MiB (limits: 0.625 MiB, 4096 tokens, "
                      "655360 est)"]
# (an empty cache counts 1 byte a token, so the token estimate is the byte limit: 655360)"""),
    md("""The seven steps as a picture: one row per `alloc`, the dashed box is the byte limit, entries are
in FIFO order with the oldest (the next to be evicted) on the left."""),
    code("""names = {x.id: n for n, x in zip("adef", (a, d, e, f))}
assert [len(s.entries) for s in rec.steps] == [1, 1, 1, 1, 2, 2, 0]
cache_fifo.image(rec.steps, names=names)"""),
    md("""## `load`: f_keep, f_sim, the 0.25 floor and the order of the scan
For a new prompt, each entry gets `f_keep = lcp / len(entry)` (how much of the entry is useful) and
`f_sim = lcp / len(new)` (how much of the new prompt it covers), in float32. The baseline is the
slot itself (`f_keep` -1 for an empty slot, so any entry can beat it). Entries with `f_keep < 0.25`
are skipped ("don't trash large prompts"); the others are scanned oldest first, and an entry becomes
the best only if it beats the running best on **both** axes (spec 2.4).

Five entries share the first `lcp` tokens of a 100-token prompt; the server's `load` lines follow."""),
    code("""new = toks((0, 100))                                         # the new prompt
# its first lcp tokens, then its own
entry = lambda lcp, n, tail: toks((0, lcp), (tail, tail + n - lcp))
# 1: f_keep 0.20 < 0.25: skipped, although it covers 60 % of the prompt
fifo = [entry(60, 300, 10_000),
        entry(30, 40, 20_000),    # 2: f_keep 0.75,  f_sim 0.30: beats the empty slot
        # 3: f_keep 0.25 exactly: on the floor, considered (the test is < 0.25)
        entry(50, 200, 30_000),
        entry(70, 80, 40_000),    # 4: f_keep 0.875, f_sim 0.70: beats 2 on both
        entry(90, 150, 50_000)]   # 5: f_sim 0.90 is the best, but f_keep 0.60 < 0.875: loses
def scan(order):
    c = PromptCache(0, 4096)
    for t in order:
        c.alloc(t, [], PER_TOKEN * len(t))
    c.on_event = log                                         # print only the load's lines
    return c.load(np.empty(0, np.int32), new)               # an empty slot
res = scan(fifo)
got = [(s.n_tokens, round(float(s.f_keep), 3), round(float(s.f_sim), 3), s.below_floor, s.improved)
       for s in res.scores]
assert got == [(300, 0.2, 0.6, True, False), (40, 0.75, 0.3, False, True),
               (200, 0.25, 0.5, False, False),
               (80, 0.875, 0.7, False, True), (150, 0.6, 0.9, False, False)]
assert res.scores[2].f_keep == np.float32(0.25) and res.entry.n_tokens() == 80
assert lines[-7:] == [" - looking for better prompt, base f_keep = -1.000, f_sim = 0.000",
                      "   - prompt with length     300, lcp =      60, f_keep = 0.200, f_sim = "
                      "0.600",
                      "   - prompt with length      40, lcp =      30, f_keep = 0.750, f_sim = "
                      "0.300",
                      "   - prompt with length     200, lcp =      50, f_keep = 0.250, f_sim = "
                      "0.500",
                      "   - prompt with length      80, lcp =      70, f_keep = 0.875, f_sim = "
                      "0.700",
                      "   - prompt with length     150, lcp =      90, f_keep = 0.600, f_sim = "
                      "0.900",
                      " - found better prompt with f_keep = 0.875, f_sim = 0.700"]
cache_scores.image(res, titles=["one load: the FIFO scanned oldest first (the server's order)"])"""),
    md("""Read the picture from point 1 to 5. Entry 1 (300 tokens) is scanned first and, against an empty slot,
would have won: the floor skips it, because restoring 300 tokens to keep 60 would trash a large prompt.
Entry 3 sits exactly on the floor line and is considered, but it is not better than entry 2 on
`f_keep`. Entry 4 lands in entry 2's quadrant (dashed): the new best. Entry 5 covers 90 % of the
new prompt, more than entry 4's 70 %, but its `f_keep` 0.60 is below 0.875: outside the green
"beats both" region, it loses. The server restores the 80-token entry (`f_keep = 0.875, f_sim = 0.700`).

## The order of the scan decides (spec appendix B)
"Better on both" is not an order: entries 4 and 5 each win on one axis. Scan the same five entries
newest first and entry 5, met before entry 4, becomes the best, which entry 4 cannot then beat:"""),
    code("""rev = scan(fifo[::-1])
assert [s.n_tokens for s in rev.scores] == [150, 80, 200, 40, 300]
assert ([s.improved for s in rev.scores] == [True, False, False, False, False]
        and rev.entry.n_tokens() == 150)
assert lines[-7:] == [" - looking for better prompt, base f_keep = -1.000, f_sim = 0.000",
                      "   - prompt with length     150, lcp =      90, f_keep = 0.600, f_sim = "
                      "0.900",
                      "   - prompt with length      80, lcp =      70, f_keep = 0.875, f_sim = "
                      "0.700",
                      "   - prompt with length     200, lcp =      50, f_keep = 0.250, f_sim = "
                      "0.500",
                      "   - prompt with length      40, lcp =      30, f_keep = 0.750, f_sim = "
                      "0.300",
                      "   - prompt with length     300, lcp =      60, f_keep = 0.200, f_sim = "
                      "0.600",
                      " - found better prompt with f_keep = 0.600, f_sim = 0.900"]
cache_scores.image(res, rev, titles=["oldest first (the server's scan): 80 tokens win",
                                     "the same entries, newest first: 150 tokens win"])"""),
    md("""The server always scans oldest first, so in practice the winner depends on which conversation was
saved first. `--cache-ram` only decides how many entries are there to scan.

## On the live model: save, load, remove-on-load, `update()`
`update()` enforces the byte limit, then a token limit of `max(n_ctx, limit_size / bytes per token)`,
re-estimated every time (spec 2.5). One slot, three documents of 101 tokens each, then the second
document again with a question added. Each new document makes the slot save what it held (the
server's `prompt_save`), and a 4 MiB budget holds two of these 1.796 MiB entries."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary
eng = Engine("-np 1 -c 2048 --swa-full -sps 0 --cache-ram 4")
doc = lambda topic, n: " ".join(f"Note {i} on {topic}: item {i*7} is filed on shelf {i % 5}."
                                for i in range(n))
rs = [ask(eng, doc(t, 6), 2) for t in ("orchards", "glaciers", "quarries")]
for x in rs:
    print(summary(x))
before = [(e["id"], e["n_tokens"], e["head"]) for e in eng.cache_json()["entries"]]
print(before)
assert [(x["timings"]["cache_n"], x["timings"]["prompt_n"], x["tokens_evaluated"],
         x["tokens_cached"])
        # they share 5 tokens
        for x in rs] == [(0, 101, 101, 102), (5, 96, 101, 102), (5, 96, 101, 102)]
assert before == [(0, 102, "Note 0 on orchards: item "), (1, 102, "Note 0 on glaciers: item ")]
assert [round(e["size"] / MIB, 3) for e in eng.cache_json()["entries"]] == [1.796, 1.796]"""),
    md("""Now the glaciers document again, with a question. The slot holds quarries, so the server saves it
(making room: orchards, the oldest, goes), then scans the cache: the glaciers entry keeps 101 of its
102 tokens (`f_keep` 0.990) and covers 101 of the 103 new ones (`f_sim` 0.981); the quarries entry just
saved shares only 5 tokens, `f_keep` 0.049, below the floor. The glaciers entry is restored and
**removed from the cache** (remove-on-load: a hit is never kept)."""),
    code("""n0 = len(eng.events.log)
r = ask(eng, doc("glaciers", 6) + " And?", 2); print(summary(r))
for e in eng.events.log[n0:]:
    if e.kind.startswith("cache_") and e.message and e.kind != "cache_update_end":   # its ms vary
        print(e.message)
after = [(e["id"], e["n_tokens"], e["head"]) for e in eng.cache_json()["entries"]]
print(after)
msgs = [e.message for e in eng.events.log[n0:]]
# glaciers came back from RAM
assert r["timings"]["cache_n"] == 101 and r["timings"]["prompt_n"] == 2
assert r["tokens_evaluated"] == 103 and r["tokens_cached"] == 104
assert " - cache state: 1 prompts, 1.796 MiB (limits: 4.000 MiB, 2048 tokens, 2048 est)" in msgs
assert " - making room for prompt cache entry, removing oldest entry (size = 1.796 MiB)" in msgs
assert "   - prompt with length     102, lcp =     101, f_keep = 0.990, f_sim = 0.981" in msgs
assert "   - prompt with length     102, lcp =       5, f_keep = 0.049, f_sim = 0.049" in msgs
assert " - found better prompt with f_keep = 0.990, f_sim = 0.981" in msgs
assert after == [(2, 102, "Note 0 on quarries: item ")]     # orchards made room, glaciers was taken"""),
    md("""The same load on the f_keep × f_sim plane, drawn from the event the engine recorded
(`cache_load_scores`). This time the baseline is visible: the slot held quarries, which shares 5
tokens with the new prompt (`f_keep` 0.049, `f_sim` 0.049), and the entry just saved from it sits on
the same spot, left of the floor."""),
    code("""ev = [e for e in eng.events.log[n0:] if e.kind == "cache_load_scores"][-1]
assert [(s["n_tokens"], s["lcp"], s["below_floor"], s["winner"]) for s in ev.data["scores"]] == \\
    [(102, 101, False, True), (102, 5, True, False)]
assert round(ev.data["f_keep_base"], 3) == 0.049
cache_scores.image(ev, titles=["the live load: glaciers restored"], size=4.6)"""),
    md("""The live panel's picture of this engine: the slot's tokens by provenance (the 101 restored tokens
are "cache"), and the RAM-cache strip with the one entry left, quarries."""),
    code("""from slotlab.panel.static import panel_image
assert len(eng.cache_json()["entries"]) == 1
panel_image(eng)"""),
    md("""## Try this
1. Set `--cache-ram -1` (no byte limit) and a small `-c`: the cache is then capped at `n_ctx` tokens in
   total — watch the `cache token limit` evictions.
2. Give entry 5 a shorter tail, `entry(90, 95, 50_000)` (`f_keep` 0.947): it now wins in both scan
   orders. Why?
3. Inject the allocation failure on the live engine (`Engine(..., allocate=...)`) and read the
   `cache size limit reduced` line in the event log.

Next in the reading order: [05 · Idle slots](05-idle-slots.ipynb), where idle slots meet this cache."""),
]
