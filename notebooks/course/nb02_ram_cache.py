"""Notebook 02-ram-cache: its cells (markdown and code), written by `notebooks/build_notebooks.py 02-ram-cache`."""

from course.cells import code, md

NAME = "02-ram-cache"

CELLS = [
    md("""# 02 · The RAM prompt cache (`--cache-ram`)

When a slot is about to lose most of what it holds, llama-server saves the slot's sequence state
(`llama_state_seq_get_data_ext`) into a RAM cache, and a later request can restore it into any slot.
The policy (spec section 2) is small and exact; slotlab keeps it pure (`slotlab.engine.prompt_cache`)
so each rule can be shown on its own with synthetic sizes, then on the live model."""),
    code("""import numpy as np
from slotlab.engine.prompt_cache import PromptCache

events = []
def log(kind, **f):
    if f.get("message"):          # the server's log line for each decision
        events.append(f["message"].strip())
        print(f["message"])

cache = PromptCache(limit_size=1000, limit_tokens=4096, on_event=log)
toks = lambda *r: np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in r])"""),
    md("""## `alloc`: dedupe, over-limit skip, obsolete prefix, make room
Rules run in this order (spec 2.3): (1) a prompt that is a prefix of a cached one is skipped;
(3) a single entry larger than the whole budget is skipped *before* anything is evicted; (4) cached
prompts that are a prefix of the new one are removed as obsolete; (5) the oldest entries are evicted
until the new one fits."""),
    code("""a = cache.alloc(toks((0, 100)), [], 300)          # A: 100 tokens, 300 bytes
b = cache.alloc(toks((0, 50)), [], 150)           # a prefix of A: already cached
c = cache.alloc(toks((500, 600)), [], 2000)       # bigger than the 1000-byte budget: skipped
d = cache.alloc(toks((0, 100), (100, 160)), [], 400)  # extends A: A is obsolete
e = cache.alloc(toks((900, 1000)), [], 500)       # needs room: the oldest goes
f = cache.alloc(toks((2000, 2100)), [], 450)
print([x.n_tokens() for x in cache.entries], cache.size())
assert b is None and c is None and [x.n_tokens() for x in cache.entries] == [100, 100] and cache.size() == 950"""),
    md("""## The 40 % shrink
If allocating the buffers fails (`std::bad_alloc`), the server permanently lowers the byte limit to
40 % of what the cache holds. slotlab makes that failure injectable:"""),
    code("""def failing(n):
    raise MemoryError("injected")
cache.allocate = failing
g = cache.alloc(toks((3000, 3050)), [], 100)
cache.allocate = lambda n: np.zeros(n, dtype=np.uint8)
print("limit now", cache.limit_size, "bytes")
# make room ran first (950 + 100 > 1000: the oldest 500-byte entry went), then the failure: 40 % of the
# 450 bytes left; update() then evicts down to that new limit (nothing removed comes back)
assert g is None and cache.limit_size == int(0.4 * 450) and cache.size() <= cache.limit_size"""),
    md("""## `load`: f_keep, f_sim, the 0.25 floor and the order of the scan
For a new prompt, each entry gets `f_keep = lcp / len(entry)` (how much of the entry is useful) and
`f_sim = lcp / len(new)` (how much of the new prompt it covers), in float32. Entries with
`f_keep < 0.25` are skipped; otherwise an entry wins only if it beats the running best on **both**
axes, scanning oldest first — so the result depends on the order (spec appendix B):"""),
    code("""new = toks((0, 60), (5000, 5040))                 # 100 tokens
A = toks((0, 60), (7000, 7020))                   # 80 tokens, lcp 60: f_keep 0.75, f_sim 0.60
B = toks((0, 90), (8000, 8210))                   # 300 tokens, lcp 60: f_keep 0.20 (below the floor)
B2 = toks((0, 60), (8000, 8180))                  # 240 tokens, lcp 60: f_keep 0.25, f_sim 0.60
for order in ((A, B2), (B2, A)):
    c2 = PromptCache(0, 4096)
    for t in order:
        c2.alloc(t, [], 10)
    res = c2.load(np.empty(0, np.int32), new)      # an empty slot: baseline f_keep -1
    print([(s.n_tokens, round(float(s.f_keep), 3), round(float(s.f_sim), 3), s.winner) for s in res.scores])
    assert res.entry is not None and res.entry.n_tokens() == 80 if order[0] is A else res.entry.n_tokens() == 240"""),
    md("""Both entries cover the same 60 tokens (`f_sim` 0.60 each), so whichever is scanned first wins and
the other cannot beat it strictly: the 80-token entry when it is older, the 240-token one otherwise.

## On the live model: save, load, remove-on-load, `update()`
`update()` enforces the byte limit, then a token limit of `max(n_ctx, limit_size / bytes per token)`,
re-estimated every time (spec 2.5)."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary
eng = Engine("-np 1 -c 2048 --swa-full -sps 0 --cache-ram 4")   # room for two ~1.9 MiB entries
doc = lambda topic, n: " ".join(f"Note {i} on {topic}: item {i*7} is filed on shelf {i % 5}." for i in range(n))
for t in ("orchards", "glaciers", "quarries"):
    print(summary(ask(eng, doc(t, 6), 2)))
print([(e["id"], e["n_tokens"], e["head"]) for e in eng.cache_json()["entries"]])
r = ask(eng, doc("glaciers", 6) + " And?", 2); print(summary(r))
for e in eng.events.log[-40:]:
    if e.kind in ("cache_save", "cache_evict", "cache_load_found", "cache_state") and e.message:
        print(e.message)
print([(e["id"], e["n_tokens"], e["head"]) for e in eng.cache_json()["entries"]])
assert r["timings"]["cache_n"] > 50                                       # glaciers came back from RAM
assert [e["head"].split()[3] for e in eng.cache_json()["entries"]] == ["quarries:"]  # orchards made room, glaciers was taken"""),
    md("""## Try this
1. Set `--cache-ram -1` (no byte limit) and a small `-c`: the cache is then capped at `n_ctx` tokens in
   total — watch the `cache token limit` evictions.
2. Build two entries where one is better on `f_keep` and the other on `f_sim`: which one wins, and why
   is it never the "best of both"?
3. Inject the allocation failure on the live engine (`Engine(..., allocate=...)`) and read the
   `cache size limit reduced` line in the event log."""),
]
