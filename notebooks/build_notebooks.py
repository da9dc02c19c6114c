"""Write and execute the course notebooks (outputs are committed; nbval compares them in `make test`).

    .venv/bin/python notebooks/build_notebooks.py [NAME ...]
Each notebook runs on the embedded default model in step mode (no thread, greedy, ignore_eos, so
every number is deterministic), explains what happens and why, and asserts what it claims."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat as nbf
from nbclient import NotebookClient

HERE = Path(__file__).parent
IGNORE = "# NBVAL_IGNORE_OUTPUT\n"


def md(s: str):
    return nbf.v4.new_markdown_cell(s.strip())


def code(s: str, ignore: bool = False):
    return nbf.v4.new_code_cell((IGNORE if ignore else "") + s.strip())


NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["01-tour"] = [
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

NOTEBOOKS["02-ram-cache"] = [
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

NOTEBOOKS["03-save-load"] = [
    md("""# 03 · Slot save / restore / erase (`--slot-save-path`)

`POST /slots/{id}?action=save|restore|erase` writes a slot's KV state to a file and reads it back.
The file is `llama_state_seq_save_file`'s body: a header, the slot's tokens (packed as
`server_tokens` state), then the sequence state. That is all the stock server writes: **no context
checkpoints travel with the file.** On a memory that cannot be cut back (Gemma 3's sliding window, a
hybrid or recurrent model) the next request after a restore then re-processes everything, because
any cut-back needs a checkpoint (section "Stock file vs appendix" below).

**slotlab extension, opt-in (`--slot-appendices`):** slotlab can append an `SCKP` checkpoint appendix
(and an `SDFT` draft appendix) after the body; a stock llama-server of the same build restores the
body and ignores them. By default slotlab writes and reads files exactly as the server does."""),
    code("""import tempfile, struct
from pathlib import Path
from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, action, hexdump

d = Path(tempfile.mkdtemp())
eng = Engine(f"-np 2 -c 4096 --slot-save-path {d} --slot-appendices")   # default flags + the opt-in appendix
prompt = " ".join(f"Entry {i} of the lighthouse log: fog at dawn, clear by noon." for i in range(12))
print(summary(ask(eng, prompt, 3, id_slot=0)))
status, reply = action(eng, "save", 0, "log.bin"); print(status, reply)
assert status == 200 and reply["n_saved"] == len(eng.slots[0].tokens)"""),
    md("""## The file, byte by byte
Magic 0x67677371 (`LLAMA_STATE_SEQ_MAGIC`, "ggsq"; written little-endian, so the dump shows the bytes
`71 73 67 67`, "qsgg"), version 3, the number of 32-bit words, then the packed tokens: marker -1,
version 1, the token count, the tokens, a media count of 0. The state follows; after it, the SCKP
appendix (magic 0x504b4353, "SCKP" read the same way round)."""),
    code("""raw = (d / "log.bin").read_bytes()
print(hexdump(raw, 0, 48))
magic, version, n_words = struct.unpack_from("<III", raw)
print(f"magic {magic:08x}, version {version}, {n_words} words")
body = reply["n_written"]
print(f"body {body} bytes, appendix {len(raw) - body} bytes")
print(hexdump(raw, body, 16))
assert raw[:4] == b"qsgg" and magic == 0x67677371 and struct.unpack_from("<I", raw, body)[0] == 0x504B4353
n_ck = struct.unpack_from("<I", raw, body + 8)[0]
print(f"{n_ck} checkpoint(s) in the appendix: {len(raw) - body} bytes beside a {body}-byte body")
assert n_ck == len(eng.slots[0].checkpoints) >= 1"""),
    md("""The appendix is large next to the body because each checkpoint holds the sliding window's
KV (up to 512 cells of every SWA layer), while the body holds only the cells of this short prompt."""),
    md("""## Erase, restore, and the next request reuses the restored tokens"""),
    code("""print(action(eng, "erase", 0))
print(action(eng, "restore", 0, "log.bin"))
print("checkpoints restored from the appendix:", len(eng.slots[0].checkpoints))
r = ask(eng, prompt + " Any storms?", 3, id_slot=0); print(summary(r))
assert r["timings"]["cache_n"] > 0"""),
    md("""Restoring into **another** slot works the same way (the file names no slot)."""),
    code("""print(action(eng, "restore", 1, "log.bin"))
r1 = ask(eng, prompt + " Any ships?", 3, id_slot=1); print(summary(r1))
assert r1["id_slot"] == 1 and r1["timings"]["cache_n"] > 0"""),
    md("""## Stock file vs appendix: the lesson for SWA, hybrid and recurrent models
The same save, erase, restore and follow-up, once with the server's own file (no checkpoints) and once
with slotlab's appendix. Without a checkpoint the restored slot's memory cannot be cut back to the
common prefix (`pos_min` >= `max(0, pos_next - n_swa)`), so the stock server re-processes the whole
prompt: `cache_n` 0. This is what llama.cpp issue #26676 reports on hybrid models."""),
    code("""cache_n = {}
for label, extra in (("stock file", ""), ("with --slot-appendices", " --slot-appendices")):
    e = Engine(f"-np 1 -c 4096 --slot-save-path {d}" + extra, model=eng.model)
    ask(e, prompt, 3)
    action(e, "save", 0, "cmp.bin"); action(e, "erase", 0); action(e, "restore", 0, "cmp.bin")
    cache_n[label] = ask(e, prompt + " Any storms?", 3)["timings"]["cache_n"]
    e.close()
print(cache_n)
assert cache_n["stock file"] == 0 and cache_n["with --slot-appendices"] > 100"""),
    md("""## Failure modes, with the server's texts
A failed restore leaves the slot **empty** (the server clears it), so the next request on that slot
starts from nothing."""),
    code("""for act, slot, name in [("save", 0, "../escape.bin"), ("save", 0, "a:b"), ("save", 0, ""),
                        ("restore", 0, "missing.bin")]:
    print(act, repr(name), *action(eng, act, slot, name))
(d / "cut.bin").write_bytes(raw[: body // 2])
status, rep = action(eng, "restore", 0, "cut.bin"); print("truncated:", status, rep)
print("slot 0 after a failed restore:", len(eng.slots[0].tokens), "tokens")
assert status == 400 and len(eng.slots[0].tokens) == 0
other = Engine(f"-np 2 -kvu -c 4096 --slot-save-path {d}", model=eng.model)   # unified: another layout
status, rep = action(other, "restore", 0, "log.bin"); print("other layout:", status, rep)
assert status == 400"""),
    md("""## Try this
1. Start the engine with `--swa-full`: the memory can be cut back, and the stock file is enough.
2. Save a slot, generate more in it, then restore: what happens to the tokens generated after the save?
3. Truncate the file inside the appendix instead of the body: the restore succeeds, without checkpoints."""),
]

NOTEBOOKS["04-cache-reuse-shifting"] = [
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

NOTEBOOKS["05-idle-slots"] = [
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

NOTEBOOKS["06-checkpoints"] = [
    md("""# 06 · Context checkpoints on a sliding-window model (`--ctx-checkpoints`)

Gemma 3's SWA layers forget positions older than the 512-token window, so a slot cannot simply be cut
back to an earlier position (spec 3.5). The server therefore takes **checkpoints** (PARTIAL_ONLY
state snapshots) while processing a prompt — before the batch is decoded, at `N - (4 + n_ubatch)` and
`N - 4`, and at user-message starts — and restores the newest usable one when a later request
diverges. With none usable it re-processes the whole prompt."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary
doc = lambda topic, n: " ".join(f"Note {i} on {topic}: item {i*7} is filed on shelf {i % 5}." for i in range(n))
eng = Engine("-np 1 -c 4096")
long = doc("harbours", 48)
r = ask(eng, long, 3); print(summary(r))
for c in eng.slots[0].checkpoints:
    print(f"checkpoint at n_tokens {c.n_tokens}: pos [{c.pos_min}, {c.pos_max}], {c.size() / 2**20:.2f} MiB")
N = r["tokens_evaluated"]
assert [c.n_tokens for c in eng.slots[0].checkpoints] == [N - (4 + 512), N - 4]"""),
    md("""## Diverging inside and outside the window"""),
    code("""def ckpt_story(eng, task_id):
    msgs = [e.message for e in eng.events.log if e.task == task_id and e.kind in
            ("checkpoint_restored", "checkpoint_none", "checkpoint_evict", "checkpoint_created")]
    return msgs or ["(the memory still holds what n_past needs: no checkpoint involved)"]

cases = {"inside the window (near the end)": doc("harbours", 46) + " Stop here.",
         "before the window, after a checkpoint": doc("harbours", 27) + " Stop here.",
         "far back, before every checkpoint": doc("harbours", 10) + " Start over."}
res = {}
for label, p in cases.items():
    ask(eng, long, 3)                       # put the long prompt back in the slot first
    res[label] = ask(eng, p, 3)
    tid = max(t.id for t in eng.tasks.values() if t.done)
    print(f"{label}: {summary(res[label])}")
    for m in ckpt_story(eng, tid):
        print("   ", m[:110])
r_in, r_mid, r_far = res.values()
assert r_in["timings"]["cache_n"] > 800 and 0 < r_mid["timings"]["cache_n"] < 600 and r_far["timings"]["cache_n"] == 0"""),
    md("""## Trade-offs: how many, how far apart
`--ctx-checkpoints` caps the list per slot (oldest evicted first); `--checkpoint-min-step` spaces them.
Checkpoints also travel with RAM-cache entries, and their bytes count against `--cache-ram`:"""),
    code("""chat = "".join(f"<start_of_turn>user\\n{doc(f'ledger {i}', 8)}<end_of_turn>\\n<start_of_turn>model\\nFiled.<end_of_turn>\\n" for i in range(4))
delims = [{"role": "user", "delimiter": "<start_of_turn>user\\n"}, {"role": "assistant", "delimiter": "<start_of_turn>model\\n"}]
for flags in ("-np 1 -c 8192 -cms 128", "-np 1 -c 8192 -cms 128 --ctx-checkpoints 2"):
    e2 = Engine(flags, model=eng.model)
    ask(e2, chat + "<start_of_turn>user\\nSum up.<end_of_turn>\\n<start_of_turn>model\\n", 2, message_delimiters=delims)
    ck = e2.slots[0].checkpoints
    print(f"{flags:45s} {len(ck)} checkpoints, {sum(c.size() for c in ck) / 2**20:.2f} MiB, at {[c.n_tokens for c in ck]}")
assert len(ck) == 2"""),
    md("""## Try this
1. Add `--swa-full`: no checkpoints are created (the memory can be truncated), at the price of a full-
   size SWA cache — compare `eng.ctx.state_seq_size(0)`.
2. Lower `--checkpoint-min-step` to 0 and count the checkpoints of a long multi-turn chat.
3. Evict the slot to the RAM cache (send an unrelated request with `-np 1`) and come back: the
   checkpoints come back with the entry."""),
]

NOTEBOOKS["07-tune-your-server"] = [
    md("""# 07 · Tune your server: replay traffic under several flag settings

A multi-tenant trace: four users share a long system prompt and each continues their own
conversation turn by turn; one user pastes a long document in between. We replay it under several settings and compare the prompt-cache hit rate,
prefill tokens saved and RAM used. Replace the trace with your own (same JSON as `slotlab replay`)."""),
    code("""import json, tempfile
from pathlib import Path
from slotlab.engine.replay import parse_trace, load_trace, replay
from slotlab.llama import Model

SYSTEM = "You are the support assistant of a bicycle shop. Policies: " + " ".join(f"Rule {i}: be kind about item {i}." for i in range(25))
users = ["Ana", "Ben", "Chen", "Dara"]
def convo(u, turn):
    past = "".join(f"\\nUser {u}: question {k} about my order\\nAssistant: answer {k}." for k in range(turn))
    return f"{SYSTEM}{past}\\nUser {u}: question {turn} about my order"
reqs = []
for turn in range(3):
    for u in users:
        reqs.append({"prompt": convo(u, turn), "n_predict": 4})
    if turn == 1:
        reqs.append({"prompt": "Summarize: " + " ".join(f"Paragraph {i} of the manual explains gear {i}." for i in range(60)), "n_predict": 4})
base = {"flags": [], "requests": reqs}
print(len(reqs), "requests")"""),
    code("""model = Model()
settings = {
    "defaults (-np auto, unified)": ["-c", "8192"],
    "--cache-ram 0": ["-c", "8192", "--cache-ram", "0"],
    "-sps 0 (LRU only)": ["-c", "8192", "-sps", "0"],
    "-sps 0 --cache-ram 0": ["-c", "8192", "-sps", "0", "--cache-ram", "0"],
    "-np 2 -sps 0 (not unified)": ["-np", "2", "-c", "8192", "-sps", "0"],
    "--swa-full": ["-c", "8192", "--swa-full"],
}
rows = []
for name, flags in settings.items():
    out = replay(parse_trace({"flags": flags, "requests": reqs}), model=model)
    eng = out.pop("engine")
    m = eng.metrics
    ram = max([e.data["size"] for e in eng.events.filter(["cache_state"])] or [0])
    rows.append((name, m.hit_rate, m.prompt_tokens_cached_total, m.prompt_tokens_total, ram / 2**20))
    eng.close()
for r in rows:
    print(f"{r[0]:32s} hit rate {r[1]:6.1%}  reused {r[2]:6d}  prefilled {r[3]:6d}  peak RAM cache {r[4]:7.2f} MiB")
hit = {r[0]: r[1] for r in rows}
assert hit["--swa-full"] > hit["-np 2 -sps 0 (not unified)"] > hit["defaults (-np auto, unified)"]
assert hit["-sps 0 --cache-ram 0"] > hit["-sps 0 (LRU only)"]   # here the RAM cache even hurts"""),
    md("""Why so different? On Gemma 3 without `--swa-full`, a slot can only go back to a position for which a
checkpoint exists (spec 3.5): a user's **own** next turn extends their previous prompt (a checkpoint
sits 4 tokens before its end), but another user's prompt diverges right after the shared system
prompt, where there is none — full re-processing.
* With the defaults, LCP similarity sends every tenant to the slot holding the shared system prompt
  (`f_sim` ≈ 0.98), and every switch of tenant re-processes everything: 0 % reuse.
* The RAM cache ranks entries by `f_keep` / `f_sim`, not by whether a checkpoint makes them usable:
  Chen's first turn loads Ana's conversation (it differs only in the name), cannot use it, and the
  load also removes it from the cache (remove-on-load), so Ana's next turn finds nothing. That is why
  `-sps 0 --cache-ram 0` beats `-sps 0` on this traffic.
* With separate slots (`-np 2`, not unified) conversations stay in their slots.
* `--swa-full` keeps the whole SWA cache (more KV memory), so any shared prefix is reusable.
  `message_delimiters` (sent by chat endpoints) would put checkpoints at user-message starts instead.
Run the `why` helper (`from slotlab.lab import why`) on any of these engines to read it request by request."""),
    code("""import plotly.graph_objects as go
fig = go.Figure([go.Bar(name="tokens reused", x=[r[0] for r in rows], y=[r[2] for r in rows]),
                 go.Bar(name="tokens prefilled", x=[r[0] for r in rows], y=[r[3] for r in rows])])
fig.update_layout(barmode="stack", height=360, title="prompt tokens per setting")
fig.show()""", ignore=True),
    md("""## Your own trace
Write your traffic as `{"flags": [...], "requests": [{"prompt": ..., "n_predict": ...}, ...]}` (slot
actions and `"wait": false` for concurrency work too) and load it:"""),
    code("""path = Path(tempfile.mkdtemp()) / "my-trace.json"
path.write_text(json.dumps({"flags": ["-c", "8192"], "requests": reqs[:5]}))
out = replay(load_trace(path), model=model)
print([(r["id_slot"], r["cache_n"], r["prompt_n"]) for r in out["results"]])
out["engine"].close()"""),
    md("""## Try this
1. Add `"-np 8 -kvu"` to the settings: more slots, same pool — does the hit rate move?
2. Shrink `--cache-ram` until entries are evicted by bytes; find the knee in the hit rate.
3. Replay a log of your own application (`slotlab replay my-trace.json --events ev.jsonl`) and open the
   events in pandas (`engine.events.to_dataframe()`)."""),
]


NOTEBOOKS["08-size-your-cache"] = [
    md("""# 08 · Size your cache: conversation traffic on an 8B model, simulated

*How big should `--cache-ram` be, how many slots (`-np`), how many checkpoints (`--ctx-checkpoints`),
for my traffic and my model?* Answering that on the real server takes hours of GPU time per setting.
`slotlab.sim` answers it offline: the server's own slot, RAM-cache and checkpoint decisions run on a
**paper memory** (token ids and byte counts, no tensors, no model) on a simulated clock.

The traffic: the first 500 requests of the Mooncake **conversation** trace (Kimi's FAST'25 release,
Apache-2.0; the slice and its license are in `tests/sim/data/`): multi-turn chats whose prompts grow
turn by turn, 1k–120k tokens each. The model: **Llama 3.1 8B**, from its published hyperparameters
(`slotlab/sim/profiles/llama-3.1-8b.json`; `--profile model.gguf` reads any GGUF's header instead).
Every sweep goes through `slotlab.sim.whatif`, the same runs as
`slotlab whatif TRACE --profile llama-3.1-8b --vary "--cache-ram 0,8192,..."` on the command line."""),
    code("""from pathlib import Path
from slotlab.memory.profile import ModelProfile

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "slotlab" / "sim" / "profiles").exists())
PROFILE = ROOT / "slotlab" / "sim" / "profiles" / "llama-3.1-8b.json"
prof = ModelProfile.from_json(PROFILE)
n_kv_heads, head_dim = prof.n_head_kv[0], prof.n_embd_head_k
kv = prof.n_layer * n_kv_heads * head_dim * 2 * 2      # layers x KV heads x head dim x (K and V) x 2 bytes (f16)
print(f"{prof.name}: {prof.n_layer} layers x {n_kv_heads} KV heads x {head_dim} dims x 2 (K, V) x 2 bytes")
print(f"  = {kv:,} bytes = {kv // 1024} KiB of KV cache per token")
assert kv == prof.bytes_per_token() == 128 * 1024       # what the paper memory sizes every state blob with
for mib in (8192, 32768, 131072, 262144):
    print(f"  --cache-ram {mib:>6} holds {mib * 2**20 // kv:>9,} tokens")"""),
    md("""128 KiB a token: a 14k-token conversation is 1.75 GiB of state, so the default `--cache-ram 8192`
keeps about four of them. The trace's arrivals are a whole cluster's traffic, so we stretch them 16×
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
print(f"{len(lens)} requests over {trace.requests[-1].arrival:.0f} simulated seconds; {total:,} prompt tokens "
      f"(median {lens[len(lens) // 2]:,}, max {lens[-1]:,}), {sum(r.n_predict for r in trace.requests):,} to generate")
print(f"infinite-cache bound: {bound:,} tokens reusable = {100 * bound / total:.1f} % of the prompt tokens")
assert total == sum(lens) and 0 < bound < total"""),
    md("""## Sweep 1: `--cache-ram`

The GPU holds the slots' KV: `-c 262144 -kvu` is one unified pool of 262,144 tokens (32 GiB) shared by
the 4 slots, so a 120k-token conversation fits. The RAM cache sits behind it in host memory."""),
    code("""from slotlab.sim.whatif import run_grid

BASE = ["-c", "262144", "-kvu", "-np", "4"]

def sweep(base, flag, values):
    return run_grid(TRACE, base, [(flag, values)], speed=SPEED, profile=str(PROFILE), time_scale=TIME_SCALE, jobs=2)

def show(runs, tag="", labels=None):
    for r, label in zip(runs, labels or [tag + r.label for r in runs]):
        print(f"{label:48s} reused {100 * r.reuse:5.2f} % ({100 * r.of_bound:4.1f} % of the bound), prefilled "
              f"{r.tokens_prefilled:>9,}, peak RAM cache {r.peak_cache_bytes / 2**30:5.1f} GiB, TTFT p50 "
              f"{r.ttft_p50:6.2f} s p99 {r.ttft_p99:6.2f} s, errors {r.n_errors}")

ram = sweep(BASE, "--cache-ram", ["0", "8192", "32768", "131072", "262144", "-1"])
show(ram)
by_ram = {r.setting["--cache-ram"]: r for r in ram}
assert all(r.error is None and r.n_errors == 0 and r.tokens_reused <= r.bound_tokens for r in ram)  # never above the bound
sizes = ["8192", "32768", "131072", "262144"]
assert all(by_ram[a].tokens_reused <= by_ram[b].tokens_reused for a, b in zip(sizes, sizes[1:]))  # more RAM, more reuse
assert by_ram["8192"].tokens_reused < by_ram["32768"].tokens_reused < by_ram["0"].tokens_reused  # ... but a small cache loses
assert by_ram["-1"].tokens_prefilled == by_ram["32768"].tokens_prefilled   # -1 is not unlimited here"""),
    md("""Three things to read here.

* **More RAM never lowers reuse** once the cache is on: 8 → 32 → 128 → 256 GiB reuse more and more,
  and 256 GiB gets the most. Still well under the bound: the cache evicts its oldest entries first,
  an entry comes back only when the new prompt keeps at least a quarter of it (`f_keep` ≥ 0.25: an
  opening 512-token block shared with another conversation is below that floor), and the bound also
  counts prefixes that no slot or entry holds any more.
* **Turning a small cache on lowers reuse** below no cache at all. With a RAM cache and a unified pool
  llama-server saves every idle slot to the cache *and clears it* when a new task starts
  (`--cache-idle-slots`, on by default; docs/server-behaviour.md 1.6). A conversation between turns
  then lives only in the cache, and a cache that holds four of them evicts it (`make_room`) before its
  next turn, where without a cache it would still sit in its slot. The next cell proves it: the same
  8 GiB cache with `--no-cache-idle-slots` makes exactly the no-cache decisions.
* **`--cache-ram -1`** means no *byte* limit, not an infinite cache: the server still caps the cache
  at the context's token count (`-c`, 262,144 tokens = 32 GiB here: the `token_limit` evictions), so
  it behaves exactly as 32 GiB."""),
    code("""idle = sweep(BASE + ["--no-cache-idle-slots"], "--cache-ram", sizes)
show(idle, "--no-cache-idle-slots ")
print("--cache-ram -1 evictions:", by_ram["-1"].extra["evictions"])
by_idle = {r.setting["--cache-ram"]: r for r in idle}
assert by_idle["8192"].tokens_prefilled == by_ram["0"].tokens_prefilled    # the loss above is the idle-slot saves
assert all(by_idle[s].tokens_reused >= max(by_ram["0"].tokens_reused, by_ram[s].tokens_reused) for s in sizes)
assert all(by_idle[a].tokens_reused <= by_idle[b].tokens_reused for a, b in zip(sizes, sizes[1:]))
assert "token_limit" in by_ram["-1"].extra["evictions"]"""),
    code("""import json
import plotly.graph_objects as go
from IPython.display import display

def show_fig(fig, head, rows):
    \"\"\"The plotly figure, with the same numbers as an HTML table for viewers that run no JavaScript.\"\"\"
    html = "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>"
    display({"application/vnd.plotly.v1+json": json.loads(fig.to_json()), "text/html": html,
             "text/plain": f"<figure: {fig.layout.title.text}>"}, raw=True)

pct = lambda r: round(100 * r.reuse, 2)
fig = go.Figure([go.Scatter(x=sizes, y=[pct(by_ram[s]) for s in sizes], mode="lines+markers", name="idle slots cached (default)"),
                 go.Scatter(x=sizes, y=[pct(by_idle[s]) for s in sizes], mode="lines+markers", name="--no-cache-idle-slots"),
                 go.Scatter(x=sizes, y=[pct(by_ram["0"])] * len(sizes), mode="lines", name="--cache-ram 0",
                            line=dict(dash="dot", color="black")),
                 go.Scatter(x=sizes, y=[round(100 * bound / total, 2)] * len(sizes), mode="lines",
                            name="infinite-cache bound", line=dict(dash="dash", color="gray"))])
fig.update_layout(title="prompt tokens reused (%) vs --cache-ram (MiB), Llama 3.1 8B, -np 4 -kvu -c 262144",
                  xaxis_type="category", yaxis_title="% of prompt tokens", height=380)
show_fig(fig, ["--cache-ram", "reused (default)", "reused (--no-cache-idle-slots)", "no cache", "bound"],
         [(s, pct(by_ram[s]), pct(by_idle[s]), pct(by_ram["0"]), round(100 * bound / total, 2)) for s in sizes])"""),
    md("""## Sweep 2: `-np`

Slots trade queueing against memory: all slots share the 262,144-token pool."""),
    code("""slots = sweep(BASE[:-2] + ["--cache-ram", "131072", "--no-cache-idle-slots"], "-np", ["1", "2", "8"])
slots.insert(2, by_idle["131072"])
nps = [r.flags[r.flags.index("-np") + 1] for r in slots]
show(slots, labels=[f"--cache-ram 131072 --no-cache-idle-slots -np {n}" for n in nps])
assert nps == ["1", "2", "4", "8"]
assert all(a.ttft_p50 > b.ttft_p50 for a, b in zip(slots, slots[1:]))   # more slots, less queueing
assert slots[3].n_errors > 0 == slots[0].n_errors + slots[1].n_errors + slots[2].n_errors
fig = go.Figure([go.Bar(x=nps, y=[r.ttft_p50 for r in slots], name="TTFT p50 (s)"),
                 go.Scatter(x=nps, y=[r.ttft_p99 for r in slots], mode="markers", name="TTFT p99 (s)",
                            marker=dict(symbol="diamond", color="black"))])
fig.update_layout(title="time to first token vs -np (--cache-ram 131072 --no-cache-idle-slots)", xaxis_type="category",
                  yaxis_type="log", yaxis_title="seconds", height=360)
show_fig(fig, ["-np", "TTFT p50 (s)", "TTFT p99 (s)", "reused", "errors"],
         [(n, round(r.ttft_p50, 2), round(r.ttft_p99, 2), f"{pct(r)} %", r.n_errors) for n, r in zip(nps, slots)])"""),
    md("""One slot queues everyone behind a 120k-token prefill (TTFT in minutes); each doubling cuts the
wait. Eight slots answer fastest but **fail requests**: eight conversations of tens of thousands of
tokens no longer fit the shared 262,144-token pool, and the server answers "Context size has been
exceeded" for some. Eight slots would need a bigger `-c` (more GPU memory: 128 KiB a token)."""),
    md("""## Sweep 3: `--ctx-checkpoints`"""),
    code("""ckpt = sweep(BASE + ["--cache-ram", "8192"], "--ctx-checkpoints", ["0", "32"])
show(ckpt)
assert all(r.tokens_prefilled == by_ram["8192"].tokens_prefilled and r.ttft_p50 == by_ram["8192"].ttft_p50
           for r in ckpt)   # 0, the default 8 and 32: the same decisions"""),
    md("""No difference at all, and that is the answer for this model: Llama 3.1 is full attention, so the
server can cut a slot back to any position and never needs a context checkpoint (it makes them only
for sliding-window, hybrid and recurrent models, where a cut-back needs one: notebooks 06 and 09).
For Gemma 3 or Qwen3.5, sweep it."""),
    md("""## The setting to run

Among the settings above that served every request and kept the RAM cache within 128 GiB of host
memory, the one with the lowest median time to first token:"""),
    code("""from slotlab.sim.whatif import best

BUDGET_MIB = 131072
pick = best([r for r in ram + idle + slots if r.n_errors == 0], BUDGET_MIB, "ttft_p50")
print("llama-server", " ".join(pick.flags))
show([pick])
assert pick.flags == BASE + ["--no-cache-idle-slots", "--cache-ram", "131072"]
assert pick.peak_cache_bytes <= BUDGET_MIB * 2**20 and pick.n_errors == 0
assert pick.tokens_reused > by_ram["131072"].tokens_reused > by_ram["0"].tokens_reused
assert pick.ttft_p50 < min(r.ttft_p50 for r in ram if r.peak_cache_bytes <= BUDGET_MIB * 2**20)"""),
    md("""`-np 4 -kvu -c 262144 --cache-ram 131072 --no-cache-idle-slots`: idle conversations stay in their
slots, and 128 GiB of RAM keeps the ones the slots had to give up. Even so this trace's first 500
requests leave most of the bound on the table: their conversations come back minutes later with
prompts that outgrow what 4 slots and 128 GiB hold; the whole day's trace (12,031 requests, in
`../shared/data/mooncake/` beside a checkout) answers better for a production server.

## Try this
1. Your traffic: `slotlab whatif my-sessions.jsonl --vary "--cache-ram 0,8192,65536"` reads an
   OpenAI-messages session log (one line a call: `session_id`, `messages`, `output_length`, `gap`).
2. Eight slots without the errors: `--vary "-c 262144,524288"` with `-np 8` (and check the GPU has
   the 64 GiB of KV that 524,288 tokens take).
3. A model with a sliding window (`--profile gemma-3.gguf`): now `--ctx-checkpoints` matters."""),
]


NOTEBOOKS["09-why-did-it-reprocess"] = [
    md("""# 09 · "Why did it re-process my prompt?" — hybrid models, agents, and the flag that would have helped

The loudest caching complaint about llama-server is full prompt re-processing on **hybrid and
recurrent** models (Qwen3.5/3.6, Nemotron-H, Granite 4, LFM2) behind coding agents (llama.cpp issues
#20225, #21831, #22746). Their recurrent state cannot be rolled back: any cut-back — even by one
token — needs a **context checkpoint** at or before that point (docs/server-behaviour.md 3.5).

This notebook replays three recorded scenarios on a tiny random-weight **qwen35** (hybrid) model that
llama.cpp's own `test-llama-archs` wrote (tests/models/; the real llama-server made the same decisions
on them: tests/golden/traces_tiny/). For each request that reused fewer tokens than the server held,
`slotlab.counterfactual.diagnose_trace` says where the prompt changed, which mechanism lost the rest,
and tries the suggested flag changes by replaying the trace up to that request. The tiny model's test
vocabulary renders text as odd pieces: the positions and counts are what matter here."""),
    code("""from pathlib import Path
from slotlab.engine.replay import load_trace
from slotlab.engine.scheduler import Engine
from slotlab.counterfactual import diagnose_trace

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "tests" / "models").exists())
TINY = ROOT / "tests" / "golden" / "traces_tiny"

def trace(name):
    t = load_trace(TINY / f"{name}.json")
    t.flags = [str(ROOT / f) if f.endswith(".gguf") else f for f in t.flags]  # the model, from any directory
    return t

eng = Engine(trace("hybrid_agent_loop").flags)
info = eng.memory.info
print(f"seq_rm {info.seq_rm_type}, can_shift {info.can_shift}, checkpoints needed: {info.needs_checkpoints}")
assert info.seq_rm_type == "FULL" and info.needs_checkpoints
eng.close()"""),
    md("""## 1. An agent loop: every turn re-processes the tail
Each turn appends the assistant's tool call and the tool's result. The slot holds the previous prompt
*and* the reply it generated, but the recurrent state has moved past them: the server can only go back
to a checkpoint, and it takes them a few tokens before each prompt's end (4 and `4 + n_ubatch`). So every
turn loses the last few prompt tokens plus the reply — by design, and no flag moves that checkpoint."""),
    code("""d1 = diagnose_trace(trace("hybrid_agent_loop"), max_misses=2)
print("\\n".join(d1.lines()))
causes = {m.cause for _, m in d1.misses}
assert causes == {"checkpoint_early"} and len(d1.misses) == 6
assert all(m.lost == 4 for _, m in d1.misses)
assert all(c.saved <= 0 for cs in d1.tried.values() for c in cs)   # no flag saves it"""),
    md("""## 2. A client that rewrites a header early in the system prompt
A timestamp or billing header near the top of the prompt changes every turn. The prompt diverges a few
tokens in; every checkpoint lies after that point, so the whole prompt is processed again. More
checkpoints do not help (tried below); keeping the first tokens stable does."""),
    code("""d2 = diagnose_trace(trace("hybrid_changing_header"), max_misses=2)
print("\\n".join(d2.lines()))
first = d2.misses[0][1]
assert first.cause == "no_checkpoint" and first.n_past == 0
assert first.suggest[-1].startswith("keep the prompt's first")
assert d2.best(d2.misses[0][0]) is None    # --ctx-checkpoints 64 saved nothing"""),
    md("""## 3. Checkpoint spacing: `--ctx-checkpoints 2` with `--checkpoint-min-step 24`
A long conversation with only two checkpoints: the oldest are erased (FIFO) as new ones come, so a
branch back to an early turn finds none at or before it. The explanation names the erasures by the
cap; the counterfactual tries larger caps."""),
    code("""d3 = diagnose_trace(trace("hybrid_ctx_checkpoints_min_step"), max_misses=3)
print("\\n".join(d3.lines()))
capped = [(i, m) for i, m in d3.misses if m.cause == "no_checkpoint"]
assert capped and "erased by the --ctx-checkpoints cap" in capped[0][1].detail
assert capped[0][1].suggest[0] == "--ctx-checkpoints 4"
print({c: n for c, n in d3.lost_by_cause.items()})
assert d3.lost_by_cause["no_checkpoint"] >= 58"""),
    md("""## Reading your own server
The same explanation runs on any trace: `slotlab replay my-trace.json --why` (record the trace with
`slotlab proxy`, or write it by hand), and on a real server's log the same facts come from
`slotlab watch --log server.log` (run the server with `-lv 4`). The totals line — tokens lost by
cause — is the place to start: a large `no_checkpoint` on a hybrid model says the prompt changes
before any checkpoint; `checkpoint_early` is the price of a recurrent state on every agent turn.

## Try this
1. Replay `hybrid_branch_back` and `hybrid_slot_files` from `TINY` with `diagnose_trace`.
2. Add `--slot-appendices` to the slot-file trace: slotlab's checkpoint appendix saves what the stock
   file loses."""),
]


NOTEBOOKS["10-debug-your-own-server"] = [
    md("""# 10 · Debug your own server: from llama-server's log to the cause of a miss

Everything earlier in the course ran slotlab's engine. This chapter reads **the real llama-server's
own log** — the lines it prints at `-lv 4` — and explains each miss from those lines alone, with the
same explanations (`slotlab.explain`) the engine's events get. The logs here were recorded from the
real `llama-server` of the pinned llama.cpp (tests/golden/traces/*.llama-server.log, recorded by
tests/golden/record_traces.py); yours come from

    llama-server -m MODEL.gguf -lv 4 --log-file server.log   # plus your usual flags
    slotlab watch --log server.log --why

A *miss* is a request that reused fewer tokens than the server held for it (in a slot or in a RAM
cache entry). A log names no tokens, so what it can explain is what its numbers say."""),
    md("""## The lines that matter

| the server prints (`-lv 4`) | what it means | cause | the flag that changes it |
|---|---|---|---|
| `selected slot by LRU` after `lcp = L, ... f_sim ≤ thold` for another slot | a slot held `L` tokens but its similarity was not above `-sps` | `threshold` | a lower `-sps` |
| `- looking for better prompt` / `- prompt with length N, lcp = L, f_keep, f_sim` | the RAM cache was searched; each entry's two ratios | `floor` (f_keep < 0.25) or `two_axis` (did not beat the best on both ratios) | shorter cached prompts; a different FIFO order (`--cache-ram`) |
| `forcing full prompt re-processing due to lack of cache data` | SWA / recurrent memory cannot be cut back and no checkpoint was at or before the cut | `no_checkpoint` | `--swa-full`, `--ctx-checkpoints`, `--checkpoint-min-step` |
| `restored context checkpoint (..., n_past = P)` with `P` below the common prefix | a checkpoint saved part of it; the rest is processed again | `checkpoint_early` | `--checkpoint-min-step 0`, message boundaries |
| `erased invalidated context checkpoint` | checkpoints after the cut are gone | (follows the two above) | — |
| `- cache state: N prompts, X MiB (limits: ...)` | the RAM cache after an update: what it holds | — | `--cache-ram` |
| `purging slot` / `failed to find free space in the KV cache` | KV pressure: a slot emptied for room | dropped (the engine sees it; a log shows no tokens) | `-np`, `-c`, `-kvu` |

The rule behind `no_checkpoint` (docs/server-behaviour.md 3.5): with SWA or recurrent memory, once
the slot's oldest kept position `pos_min` is at or past `max(0, pos_next − n_swa)`, the memory cannot
be cut back to `pos_next` at all; the server then looks for a checkpoint at or before the cut, and
without one it starts again from token 0."""),
    code("""from pathlib import Path
import collections
from slotlab.watch.report import read, misses

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "tests" / "golden").exists())
LOGS = ROOT / "tests" / "golden" / "traces"

def explain(name):
    reader, events = read(LOGS / f"{name}.llama-server.log")
    found, lost = misses(events)
    return events, found, lost

def lines_of(events, task, kinds=None):
    \"\"\"The server's own lines for one request (the reader keeps each line's text on its event).\"\"\"
    return [e.message.strip() for e in events if e.task == task and e.message and (kinds is None or e.kind in kinds)]"""),
    md("""## 1. `threshold`: the slot that held the prompt was not similar enough
`-sps 0.9` asks for 90 % of the prompt in common before a slot is chosen by similarity. Slot 1 held
127 of the 211 tokens (f_sim 0.60): not enough, so the least recently used slot got the request and
processed everything."""),
    code("""events, found, lost = explain("sps_high")
(i, m), = found
print("\\n".join(lines_of(events, m.task, {"slot_sim", "slot_selected_by_lru", "prompt_seq_rm"})))
print("why:", m.line())
assert m.cause == "threshold" and (m.possible, m.lost) == (127, 127) and m.suggest[0] == "-sps 0.59"
assert "f_sim 0.60, not above -sps 0.90" in m.detail"""),
    md("""## 2. `floor` and `two_axis`: the RAM cache held it, the search passed it by
The search keeps an entry only if its `f_keep` (share of the entry reused) is at least 0.25 and it
beats the best so far on **both** `f_keep` and `f_sim`. In this log request #2 shares 7 tokens with a
150-token entry (f_keep 0.05: below the floor), and request #3's best entry (177 tokens in common,
f_sim 0.90) loses to an earlier one with a higher f_keep but only 111 tokens in common."""),
    code("""events, found, lost = explain("two_axis_order_ab")
for i, m in found:
    print(f"request #{i}:")
    print("   " + "\\n   ".join(lines_of(events, m.task, {"cache_load_base", "cache_load_score", "cache_load_found"})))
    print("   why:", m.line())
causes = [m.cause for _, m in found]
assert causes == ["floor", "two_axis"]
assert found[0][1].lost == 7 and found[1][1].lost == 66 and lost == {"two_axis": 66, "floor": 7}"""),
    md("""## 3. `no_checkpoint` and `checkpoint_early`: SWA memory and context checkpoints
Gemma 3 has a 512-token sliding window. Without `--swa-full` a slot cannot be cut back once its window
has moved, and context checkpoints (copies of the SWA state every `--checkpoint-min-step` tokens and
near each prompt's end) are the only way back. Here the third request diverges at token 209 while every
checkpoint ends later (562, 1032): the whole prompt is processed again. The next request restores a
checkpoint that ends 5 tokens short of the divergence: those 5 are processed again."""),
    code("""events, found, lost = explain("swa_checkpoints_diverge")
for i, m in found:
    print(f"request #{i}:")
    print("   " + "\\n   ".join(ln[:140] for ln in lines_of(events, m.task, {"checkpoint_check", "checkpoint_none",
                                                                              "checkpoint_restored", "checkpoint_evict"})))
    print("   why:", m.line())
(i3, m3), (i4, m4) = found
assert (i3, m3.cause, m3.lost) == (3, "no_checkpoint", 209) and "checkpoints at n_tokens [562, 1032]" in m3.detail
assert (i4, m4.cause, m4.lost) == (4, "checkpoint_early", 5)"""),
    md("""## 4. Every recorded log at once
The same reading over all 29 recorded logs: the tokens lost by cause. Five causes show in real logs;
two more (`dropped`, `slot_kept`) need the tokens themselves, which only the engine and the simulator
see — replay the traffic (`slotlab proxy` records it) with `slotlab replay trace.json --why`."""),
    code("""total = collections.Counter()
per_cause = collections.defaultdict(list)
for log in sorted(LOGS.glob("*.llama-server.log")):
    name = log.name.removesuffix(".llama-server.log")
    _, found, lost = explain(name)
    total.update(lost)
    for i, m in found:
        per_cause[m.cause].append(name)
for cause, n in total.most_common():
    print(f"{cause:18} {n:6} tokens lost  in {len(set(per_cause[cause]))} logs, e.g. {per_cause[cause][0]}")
assert len(total) >= 4 and set(total) == {"no_checkpoint", "threshold", "checkpoint_early", "floor", "two_axis"}
assert total.most_common(1)[0][0] == "no_checkpoint\""""),
    md("""## Your own server, step by step
1. Run it with `-lv 4 --log-file server.log` (`-lv 3` hides the similarity, cache and checkpoint
   lines; the reader then says what it cannot see).
2. `slotlab watch --log server.log --why`: per request the slot, cached and prefilled tokens, then each
   miss with its cause and a flag to try, and the tokens lost by cause. `--json` gives the same as data.
3. Live: `slotlab watch -- llama-server ARGS... -lv 4` starts the server and prints each decision as it
   happens; `--twin` runs slotlab beside it and reports the first decision that differs.
4. To try a flag on your traffic, record it (`slotlab proxy --upstream URL --record trace.json`) and
   replay it: `slotlab replay trace.json --why` tries the suggested flags; `slotlab simulate` and
   `slotlab whatif` (notebook 08) answer the same question at production scale without a model.

## Try this
1. Read `defaults_single_slot_checkpoints`: which flag does the explanation suggest, and why does it
   not help the second miss?
2. Strip the TRC / DBG lines from a log (what `-lv 3` prints) and read it again: which causes remain?"""),
]


def build(name: str) -> None:
    if name in NOTEBOOKS:
        nb = nbf.v4.new_notebook()
        nb.cells = NOTEBOOKS[name]
    else:  # a hand-written notebook: re-execute it in place
        nb = nbf.read(HERE / f"{name}.ipynb", 4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}},
                            store_widget_state=False)
    client.execute()
    for c in nb.cells:
        c.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    path = HERE / f"{name}.ipynb"
    nbf.write(nb, path)
    print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    for n in sys.argv[1:] or ["00-what-slotlab-runs-on", *NOTEBOOKS]:
        build(n)
