"""Notebook 12-beyond-the-flags: its cells (markdown and code), written by `notebooks/build_notebooks.py 12-beyond-the-flags`."""

from course.cells import code, md

NAME = "12-beyond-the-flags"

CELLS = [
    md("""# 12 · Beyond the flags: how far your llama-server is from the ideal cache, and what each change upstream would give you

Chapter 08 sized `--cache-ram`, `-np` and `--ctx-checkpoints` for a day of conversation traffic. Flags
run out: past some point the question is no longer *which setting* but *which change to llama-server
itself* — an open pull request, a newer build's rule, an eviction order nobody has merged — and how
far the server is from the best any cache of the same memory could do.

`slotlab whatif TRACE --proposals` answers both in one table. It runs the trace as llama-server b11312
decides (the flags you give), then once under each **proposal** (`slotlab/proposals/`: a named variant
of the server's rules, the build's own everywhere else), and sets beside them three **ideal prefix
caches** of the same memory (the slots' KV plus `--cache-ram`): LRU, Belady-optimal (it knows the
future) and infinite, computed with kvcache-simulator's rules (`slotlab.ideal`, checked against that
package by `tests/sim/test_ideal.py`). Every row counts the same requests and prompt tokens.

The traffic is chapter 08's: the first 500 requests of the Mooncake conversation trace, stretched 16×.
The models: Llama 3.1 8B (full attention) and Qwen3.5 27B (hybrid: recurrent layers and attention)."""),
    code("""from pathlib import Path
from slotlab.proposals import PROPOSALS

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "slotlab" / "sim" / "profiles").exists())
for p in PROPOSALS.values():
    print(f"{p.name:22s} {p.origin:10s} {p.status:10s} {' '.join(p.args):22s} {p.title}")
assert [p.name for p in PROPOSALS.values() if p.verified] == ["cache-ram-lru", "kvcpc"]
shown = " ".join(f"{p.origin} {p.title} {' '.join(p.args)}" for p in PROPOSALS.values())
assert all(f"#{n}" in shown for n in (22083, 23666, 26004, 26893, 28046, 28092, 28139, 28276, 28992))
assert "--cache-disk 65536" in shown  # 64 GiB of disk below the RAM cache
assert [p.name for p in PROPOSALS.values() if not p.modelled] == ["idle-completion-only"]"""),
    md("""Seven proposals. Two are **verified**: their change was built into a llama-server
(`make llama-server-proposals`: the pinned tree with `patches/proposals/*.patch`), golden traces were
recorded on it, and slotlab replays them exactly (`tests/golden/test_proposals_golden.py`). The others
are slotlab's reading of the change and say *unverified* wherever they are shown. One
(`idle-completion-only`, PR #26893) changes only rerank, embedding and infill slots, which this traffic
never has, so it is listed and not run."""),
    code("""from slotlab.proposals.price import price, table_lines
from slotlab.sim.speed import SpeedModel

TRACE = ROOT / "tests" / "sim" / "data" / "mooncake_conversation_first500.jsonl"
BASE = ["-c", "262144", "-kvu", "-np", "4"]
SPEED_8B = SpeedModel.from_rates(8000, 60)

def rows_for(profile, cache_ram, speed):
    rows = price(str(TRACE), [*BASE, "--cache-ram", cache_ram], speed=speed, profile=profile, time_scale=16, jobs=2)
    print("\\n".join(table_lines(rows)))
    return {r.name: r for r in rows}

pct = lambda r: round(100 * r.reuse, 1)
r8 = rows_for("llama-3.1-8b", "8192", SPEED_8B)
# not asserted: the whole table; the figures the prose cites are asserted below
built, ideal = r8["llama-server as built"], [r8[k] for k in ("ideal LRU", "ideal optimal", "infinite cache")]
assert [pct(built), *map(pct, ideal)] == [2.9, 3.6, 11.9, 16.4]
assert round(ideal[0].peak_cache_bytes / 2**30) == 40 and all(r.prompt_tokens == built.prompt_tokens for r in r8.values())
assert r8["cache-ram-lru"].reused == built.reused  # LRU order changes nothing on this traffic
disk = r8["cache-disk"]
assert round(pct(disk) - pct(built), 1) == 0.6 and disk.prefill_seconds_saved > 0
assert "8.8 GiB read from disk" in disk.note and round(disk.prefill_seconds_saved, 1) == 1.2
assert "2000 MB/s" in disk.note and ideal[0].note.startswith("512-token blocks")
assert (r8["kvcpc"].origin, disk.origin) == ("PR #28046", "PR #28092")"""),
    md("""With the default 8 GiB llama-server reuses **2.9 %** of the prompt tokens. An ideal LRU cache of the
same memory (40 GiB: the 32 GiB of slot KV plus the 8 GiB RAM cache, in 512-token blocks) reuses
**3.6 %**, a Belady-optimal one **11.9 %**, an infinite one **16.4 %**. Three things to read:

* **The server is close to the ideal LRU cache.** What separates it from the optimal one is foresight:
  no eviction rule that looks only backwards gets there, and no proposal tries.
* **LRU eviction (`cache-ram-lru`) changes nothing here.** The server inserts an entry when its
  conversation leaves the slot (the idle-slot save at the next task, or the slot taken by LRU), so its
  insertion order already is last-use order on this traffic. The patched server's goldens show where
  the two differ: a slot that sat idle for a long time, saved late.
* **The disk tier (PR #28092) is the one change that helps at 8 GiB, a little.** Entries the RAM cache
  evicts go to 64 GiB of disk and come back when a conversation returns: 0.6 points more reuse, for
  8.8 GiB read back, which at 2000 MB/s leaves 1.2 s of prefill saved. A llama-server entry is a whole
  conversation's state, read back entire: the disk pays where a conversation returns whole, not where
  it shares only an opening block with another."""),
    code("""r8u = rows_for("llama-3.1-8b", "-1", SPEED_8B)
# not asserted: the whole table; the figures the prose cites are asserted below
built_u, kv = r8u["llama-server as built"], r8u["kvcpc"]
assert pct(built_u) == 3.0 and pct(kv) == 15.8 and pct(r8u["infinite cache"]) == 16.4
assert built_u.reused < kv.reused <= r8u["infinite cache"].reused   # never past the bound
assert round(kv.prefill_seconds_saved, 1) == 113.7 and round(kv.peak_cache_bytes / 2**30, 2) == 745.87
assert (pct(r8u["no-sps-idle"]), pct(r8u["cache-disk"])) == (3.1, 3.4)
assert "2000 MB/s" in r8u["cache-disk"].note and r8u["ideal LRU"].note.startswith("512-token blocks")
assert (kv.origin, r8u["cache-disk"].origin) == ("PR #28046", "PR #28092")"""),
    md("""`--cache-ram -1` removes the byte limit, not the token limit: the cache still holds at most the
context's 262,144 tokens in all (chapter 08), so llama-server reuses **3.0 %**. PR #28046's per-entry
limit (`-kvcpc 0`: each entry at most one slot's context, no cap on the sum) reuses **15.8 %**, within
0.6 points of the infinite cache (16.4 %), and saves 113.7 s of prefill, at the price of the RAM the
cache then holds: 745.87 GiB at its peak. That is the trade the PR makes visible: "no byte limit"
finally means what users expect, and the RAM it takes is theirs to give."""),
    code("""from slotlab.figures import png
from slotlab.figures.proposals import overview

png.image(overview(list(r8u.values()), title="Llama 3.1 8B, -np 4 -kvu -c 262144 --cache-ram -1: the server, "
                   "each proposal, the ideal caches"))"""),
    md("""## At 27B: a hybrid model

Qwen3.5 27B keeps a recurrent state beside its attention layers, so a conversation can be cut back
only to a context checkpoint (chapter 06), and every RAM-cache entry carries its slot's checkpoints. A
27B model also prefills slower: here 2,500 prompt tokens/s and 25 tokens/s of generation (an assumption
for one large GPU; put your own, or `slotlab calibrate`'s), so every token reused is worth more
seconds."""),
    code("""SPEED_27B = SpeedModel.from_rates(2500, 25)
q = rows_for("qwen3.5-27b", "8192", SPEED_27B)
qu = rows_for("qwen3.5-27b", "-1", SPEED_27B)
# not asserted: the whole table; the figures the prose cites are asserted below
assert pct(q["llama-server as built"]) == pct(qu["llama-server as built"]) == 2.7
assert (pct(q["ideal LRU"]), pct(q["ideal optimal"])) == (3.6, 12.8) and round(q["ideal LRU"].peak_cache_bytes / 2**30) == 24
assert pct(qu["kvcpc"]) == 12.3 and round(qu["kvcpc"].prefill_seconds_saved, 1) == 273.3
assert round(qu["kvcpc"].peak_cache_bytes / 2**30, 2) == 637.62
print("the disk tier at 27B, 8 GiB of RAM:", q["cache-disk"].note, f"-> {q['cache-disk'].prefill_seconds_saved:.1f} s")
assert round(pct(q["cache-disk"]) - pct(q["llama-server as built"]), 1) == 0.4
assert "3.4 GiB read from disk" in q["cache-disk"].note and round(q["cache-disk"].prefill_seconds_saved, 1) == 8.7
same = ("find-better", "no-sps-idle", "slot-file-checkpoints")
assert all(r[n].reused == r["llama-server as built"].reused for r in (q, qu) for n in same)
assert pct(q["cache-disk"]) == 3.1 and pct(qu["infinite cache"]) == 16.4
assert "2000 MB/s" in q["cache-disk"].note and q["ideal LRU"].note.startswith("512-token blocks")
assert (qu["kvcpc"].origin, q["cache-disk"].origin) == ("PR #28046", "PR #28092")"""),
    md("""At 27B the picture is the same, with each second of prefill three times dearer. The server reuses
**2.7 %** at 8 GiB and with no byte limit alike (the token cap binds again); the ideal LRU cache of
24 GiB (16 GiB of slot KV plus the RAM cache) reuses 3.6 %, the optimal one 12.8 %. PR #28046 takes
the unlimited cache to **12.3 %** and saves 273.3 s of prefill at 2,500 tokens/s, for 637.62 GiB of
RAM. At 8 GiB the disk tier is again the best change: 0.4 points more reuse and 8.7 s of prefill saved,
for 3.4 GiB read back. The hybrid model keeps little KV per token (most of its layers are recurrent)
and prefills slowly, so a byte read back from disk is worth more prefill here than at 8B.

The proposals that change slot selection or slot files (`find-better`, `no-sps-idle`,
`slot-file-checkpoints`) change nothing here: this traffic pins no slot, no request is cut back by a
shorter one taking its slot, and nothing saves a slot file. That is an answer too. On this traffic,
of the changes in flight upstream only PR #28046 matters, and only if you give the cache the RAM."""),
    md("""## Try this
1. Your own traffic: `slotlab whatif sessions.jsonl --proposals --profile gemma-3-27b -np 4` on a
   recording of your agent (`slotlab proxy --record`); `slotlab simulate sessions.jsonl --why` names,
   for a miss no flag saves, the proposal that would have.
2. The disk tier at NVMe speed and at network speed: `--cache-disk-bandwidth 7000` and `500`. Where
   does it start paying?
3. Read `patches/proposals/01-cache-ram-lru.patch` beside `server_prompt_cache::alloc`: the whole
   proposal is one insertion order.

Back to the start: [00 · What slotlab runs on](00-what-slotlab-runs-on.ipynb), or the reading order in
the README."""),
]
