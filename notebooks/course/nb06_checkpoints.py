"""Notebook 06-checkpoints: its cells (markdown and code), written by `notebooks/build_notebooks.py 06-checkpoints`."""

from course.cells import code, md

NAME = "06-checkpoints"

CELLS = [
    md("""# 06 · Context checkpoints on a sliding-window model (`--ctx-checkpoints`)

Gemma 3 270M's SWA layers only attend to the last 512 positions (1,024 on Gemma 3 4B, 12B and 27B),
and without `--swa-full` their cache keeps
little more than that window. A slot that has moved on cannot always be cut back to an earlier
position: the [checkpoint rule](01-tour.ipynb#The-checkpoint-rule) of notebook 01 (spec 3.5) decides
when a cut-back needs a **checkpoint**, a PARTIAL_ONLY snapshot of the window cache. The server takes
checkpoints while it processes a prompt, before each batch is decoded: `4 + n_ubatch` and 4 tokens
before the prompt's end, and at user-message starts. When a later request diverges, it restores the
newest usable one, or re-processes the whole prompt if none fits.

Not every cut-back needs one. The window cache holds `n_swa + n_ubatch` cells per slot (`-ub` 512 by
default: 1024 cells here), and masked cells stay until they are overwritten. A cut-back to `pos_next`
needs no checkpoint while `pos_min`, the oldest position still held, is below `pos_next - n_swa`: on a
long prompt, a cut-back within about `n_ubatch` tokens of the slot's end (case *near the end* below).
That is a **live** slot. A slot restored from the RAM cache or a slot file holds only the window
(`state_write` skips the masked cells), so every cut-back of it needs a checkpoint, and with
`--swa-full` one deeper than the window is re-processed in full
([notebook 01](01-tour.ipynb#A-restored-slot-keeps-only-the-window)).
**Defaults in this chapter.** The server's: `--ctx-checkpoints 32` per slot,
`--checkpoint-min-step 8192`, `-ub 512`, no `--swa-full`; the first engine runs them (`-np 1 -c 4096`).
The chat section uses `-cms 128` with a `--cache-ram 32` budget, the last one `--ctx-checkpoints 2`."""),
    code("""from slotlab.engine.scheduler import Engine
from slotlab.figures import checkpoints
from slotlab.lab import ask, summary
doc = lambda topic, n: " ".join(f"Note {i} on {topic}: item {i*7} is filed on shelf {i % 5}."
                                for i in range(n))
eng = Engine("-np 1 -c 4096")
long = doc("harbours", 48)
r = ask(eng, long, 3); print(summary(r))
ck = eng.slots[0].checkpoints
for c in ck:
    cells = checkpoints.stored_cells(c.data_tgt)
    print(f"checkpoint at n_tokens {c.n_tokens}: recorded pos [{c.pos_min}, {c.pos_max}], "
          f"{c.size() / 2**20:.2f} MiB; "
          f"its bytes hold {len(cells)} cells, positions {cells.min()} to {cells.max()}")
N = r["tokens_evaluated"]
assert (r["timings"]["prompt_n"], N, r["tokens_cached"]) == (886, 886, 888)
assert [c.n_tokens for c in ck] == [N - (4 + 512), N - 4] == [370, 882]
assert [(c.pos_min, c.pos_max) for c in ck] == [(0, 369), (0, 881)]
stored = [checkpoints.stored_cells(c.data_tgt) for c in ck]
assert [(len(s), s.min(), s.max()) for s in stored] == [(370, 0, 369), (512, 370, 881)]
assert ([checkpoints.held(c.pos_min, c.pos_max, eng.memory.info.n_swa) for c in ck] == [(0, 369),
    (370, 881)])"""),
    md("""## What a checkpoint holds

The second checkpoint *reads* as if it held all 882 positions, `[0, 881]`. It does not. The server
records `pos_min` and `pos_max` from the memory when it takes the checkpoint. The window cache still
has a cell at position 0 then, because masked cells stay until they are overwritten, so `pos_min` is
0. But `state_write` skips the cells the window masks, so the checkpoint's bytes hold only the
window: 512 cells, positions 370 to 881. The bytes say so themselves, since a sequence state begins
with its cell count and each cell's position. A checkpoint's size therefore grows with the prompt
only until the prompt fills the window, then stays the same. The server's source marks the mismatch
at `[TAG_CHECKPOINTS_FIX_POS_MIN]` in `server-context.cpp`: "here we incorrectly determine that the
saved checkpoint data covers the [pos_min, pos_max] range", which "is not true for SWA models". The
restore path works around it: it only uses checkpoints with `pos_max <= pos_next`, and it resumes
from the checkpoint's last token.

## Cutting back near the end, early, and before every checkpoint

Three requests share the long prompt's first notes and then diverge. Before each one, the long prompt
is sent again, so every case starts from the same slot: the *put back* lines. Those requests take
checkpoints too, and the cases then erase some of them. Each checkpoint below is listed with the task
that created it."""),
    code("""def story(task):
    \"\"\"The task's checkpoint events, short: created / erased (why) / restored / none usable.\"\"\"
    out = []
    for e in eng.events.log:
        d = e.data
        if e.task != task:
            continue
        if e.kind == "checkpoint_created":
            out.append(f"created {d['n_tokens']}")
        elif e.kind == "checkpoint_evict":
            out.append(f"erased {d['n_tokens']} ({d['reason']})")
        elif e.kind == "checkpoint_restored":
            out.append(f"restored {d['n_tokens']} (n_past {d['n_past']})")
        elif e.kind == "checkpoint_none":
            out.append("none usable: full re-processing")
    return out

def chain():
    return [(c.n_tokens, c.id_task) for c in eng.slots[0].checkpoints]

cases = {"near the end": doc("harbours", 46) + " Stop here.",
         "early (before n_swa)": doc("harbours", 27) + " Stop here.",
         "before every checkpoint": doc("harbours", 10) + " Start over."}
seen, case_tasks = {}, []
for label, p in cases.items():
    rb = ask(eng, long, 3)                       # put the long prompt back in the slot
    tb = max(t.id for t in eng.tasks.values() if t.done)
    print(f"put back, task {tb}: {summary(rb)}; {', '.join(story(tb))}")
    before = chain()
    print(f"  checkpoints (n_tokens, task): {before}")
    rc = ask(eng, p, 3)
    tc = max(t.id for t in eng.tasks.values() if t.done)
    k = checkpoints.rewind(eng, tc)
    print(f"{label}, task {tc}: {summary(rc)}")
    print(f"  pos_next {k.pos_next}, pos_min_thold {k.pos_min_thold}, pos_min {k.pos_min}; "
          f"{', '.join(story(tc))}")
    seen[label] = (tb, rb["timings"]["cache_n"], story(tb), before, tc, k.pos_next, k.pos_min_thold,
                   rc["timings"]["cache_n"], rc["timings"]["prompt_n"], story(tc))
    case_tasks.append(tc)
assert seen["near the end"] == (1, 885, ["created 885"], [(370, 0), (882, 0), (885, 1)], 2, 848,
                                336, 848, 3,
                                ["erased 882 (invalidated)", "erased 885 (invalidated)",
                                 "created 848"])
assert seen["early (before n_swa)"] == (3, 848,
                                        ["erased 848 (supersede)", "created 848", "created 882"],
                                        [(370, 0), (848, 3), (882, 3)], 4, 487, 0, 369, 121,
                                        ["restored 370 (n_past 369)", "erased 848 (invalidated)",
                                         "erased 882 (invalidated)",
                                         "created 369", "created 486"])
assert seen["before every checkpoint"] == (5, 485,
                                           ["restored 486 (n_past 485)", "created 485",
                                            "created 882"],
                                           [(370, 0), (369, 4), (486, 4), (485, 5), (882, 5)], 6,
                                           169, 0, 0, 172,
                                           ["none usable: full re-processing",
                                            "erased 370 (invalidated)",
                                            "erased 369 (invalidated)", "erased 486 (invalidated)",
                                            "erased 485 (invalidated)", "erased 882 (invalidated)",
                                            "created 168"])
assert [eng.tasks[t].result["tokens_evaluated"] for t in case_tasks] == [851, 490, 172]
assert [eng.tasks[t].result["tokens_cached"] for t in case_tasks] == [853, 492, 174]
assert [eng.tasks[t].result["tokens_evaluated"] for t in (1, 3, 5)] == [886] * 3
assert [eng.tasks[t].result["timings"]["prompt_n"] for t in (1, 3, 5)] == [1, 38, 401]
assert [eng.tasks[t].result["tokens_cached"] for t in (1, 3, 5)] == [888] * 3"""),
    md("""* **Near the end** (task 2): the prompt diverges at 848. The threshold is `848 - 512 = 336` and the
  window cache's `pos_min` is 0, below it. The memory still holds the window the next token needs, so
  no checkpoint is involved: `cache_n` 848. The checkpoints that end after 848 are erased as
  invalidated, among them 885, which the put-back request (task 1) had just created.
* **Early** (task 4): the prompt diverges at 487, within the first `n_swa` positions. The threshold is
  0, so a checkpoint is needed. The newest one that ends at or before 487 is 370, from the very first
  request. It is restored, and the server resumes from its last token: `cache_n` 369. The put-back's
  checkpoints 848 and 882 end after 487 and are erased.
* **Before every checkpoint** (task 6): the prompt diverges at 169. Every checkpoint ends later, so
  none is usable and the whole prompt is re-processed. All five checkpoints are erased: 370 from the
  first request, 369 and 486 from the previous case, 485 and 882 from the put-back (task 5, which
  itself restored 486).

The same three decisions, drawn from the events: the dashed outline is the range each checkpoint
records, and the filled bar is the cells its bytes hold."""),
    code("""ks = [checkpoints.rewind(eng, t) for t in case_tasks]
print([(k.task, k.pos_next, k.chosen) for k in ks])
assert ([(k.task, k.pos_next, k.chosen) for k in ks] == [(2, 848, None), (4, 487, (0, 369, 370)),
    (6, 169, None)])
checkpoints.figure(eng, case_tasks)"""),
    md("""## How far apart: `--checkpoint-min-step` and its exceptions
`--ctx-checkpoints` caps the list per slot (default 32) and `--checkpoint-min-step` (`-cms`, default
8192) spaces them. When a new checkpoint comes and the list is full (or one short of full),
`create_checkpoint` first erases the checkpoints **of other requests** that lie within `-cms` of the
previous one it keeps (`erasing context checkpoint too close to an earlier one`); only if the list is
still full does it erase the oldest (`erasing old context checkpoint`, FIFO). A checkpoint at the same
`n_tokens` as a new one is replaced (`superseding`, the *supersede* above).

A chat request (`message_delimiters`: user-message starts) of four turns and a question,
with `-cms 128`. Each line is one batch of the prompt: where the server ended it, and whether it took
a checkpoint at the batch's start (spec 4.2):"""),
    code("""chat = "".join(f"<start_of_turn>user\\n{doc(f'ledger {i}', 8)}<end_of_turn>\\n"
               "<start_of_turn>model\\nFiled.<end_of_turn>\\n" for i in range(4))
delims = [{"role": "user", "delimiter": "<start_of_turn>user\\n"},
          {"role": "assistant", "delimiter": "<start_of_turn>model\\n"}]
prompt = chat + "<start_of_turn>user\\nSum up.<end_of_turn>\\n<start_of_turn>model\\n"
e2 = Engine("-np 1 -c 8192 -cms 128 --cache-ram 32", model=eng.model)
ask(e2, prompt, 2, message_delimiters=delims)
spans = e2.tasks[0].params.message_spans
users, last_user, n = [int(u)
    for u in spans.user_starts()], spans.last_user_message_pos(), e2.tasks[0].n_tokens
n_ubatch, cms = e2.memory.info.n_ubatch, 128
created = [e.data["n_tokens"] for e in e2.events.log if e.kind == "checkpoint_created"]
rows, last = [], None
for e in e2.events.log:
    if e.kind != "prompt_batch" or e.task != 0:
        continue
    end = e.data["n_tokens"]
    start = end - e.data["n_added"]
    cut = ("at a user-message start" if end in users else f"{n - end} tokens before the end"
           if end < n
           else "at the prompt end")
    if start not in created:
        why = "memory empty" if start == 0 else "no"
    elif last is None:
        why = "the first"
    elif start == last_user:
        why = "last user message"
    elif n < end + n_ubatch:
        why = f"near the end ({n} < {end} + {n_ubatch})" + ("" if start > last + cms
            else f", though {start} <= {last} + {cms}")
    else:
        why = f"{start} > {last} + {cms}"
    last = start if start in created else last
    rows.append((start, end, cut, why))
    print(f"batch [{start:3d}, {end:3d}) ends {cut:24s} " + (f"checkpoint at {start}: {why}"
        if start in created
                                                               else f"no checkpoint: {why}"))
assert (n, users, last_user, n_ubatch) == (660, [1, 163, 325, 487, 649], 649, 512)
assert created == [1, 144, 163, 325, 487, 649, 656]
assert rows == [(0, 1, "at a user-message start", "memory empty"),
                (1, 144, "516 tokens before the end", "the first"),
                (144, 163, "at a user-message start", "near the end (660 < 163 + 512)"),
                (163, 325, "at a user-message start",
                 "near the end (660 < 325 + 512), though 163 <= 144 + 128"),
                (325, 487, "at a user-message start", "near the end (660 < 487 + 512)"),
                (487, 649, "at a user-message start", "near the end (660 < 649 + 512)"),
                (649, 656, "4 tokens before the end", "last user message"),
                (656, 660, "at the prompt end",
                 "near the end (660 < 660 + 512), though 656 <= 649 + 128")]"""),
    md("""Two rules are at work (`server-context.cpp`, spec 4.2). First, the server **ends a batch** where a
checkpoint may be wanted: `4 + n_ubatch` (516) and 4 tokens before the prompt's end, and at a
user-message start that is the last one, or lies more than `-cms` after the last checkpoint, or comes
before any checkpoint. Second, it **takes a checkpoint** at the start of a batch, before decoding it,
when the memory is not empty and:

* there is no checkpoint yet (1);
* or the batch starts the **last user message** (649);
* or the batch ends **near the prompt end**: prompt length `< end of batch + n_ubatch`;
* or it starts more than `--checkpoint-min-step` after the last checkpoint.

(A batch that is not the prompt's last also has to start a user message or end near the prompt end.)
So `-cms` only applies when none of the first three holds. Here the prompt is 660 tokens, so every
batch that ends after 148 is "near the end". That is why 163 follows 144 and 656 follows 649, closer
than 128. `-cms` spaces checkpoints only in the part of a long prompt that lies more than `n_ubatch`
before its end.

## Checkpoints count against `--cache-ram`
The same request with `--ctx-checkpoints 2` keeps only the last two. Then an unrelated request takes
the slot (`-np 1`), and the server saves the chat prompt to the RAM cache together with its
checkpoints. Both engines run with `--cache-ram 32` (MiB):"""),
    code("""e3 = Engine("-np 1 -c 8192 -cms 128 --ctx-checkpoints 2 --cache-ram 32", model=eng.model)
ask(e3, prompt, 2, message_delimiters=delims)
out = {}
for name, e in (("e2", e2), ("e3", e3)):
    ck = e.slots[0].checkpoints
    # takes the slot: the chat prompt is saved
    ask(e, "Translate to German: the weather is lovely today.", 2)
    save = next(ev for ev in e.events.log if ev.kind == "cache_save" and ev.task == 1)
    alloc = [ev.data for ev in e.events.log if ev.kind == "cache_alloc" and ev.task == 1]
    skip = [ev for ev in e.events.log if ev.kind == "cache_skip_over_limit" and ev.task == 1]
    print(f"{name}: {len(ck)} checkpoints at {[c.n_tokens for c in ck]}, "
          f"{sum(c.size() for c in ck) / 2**20:.2f} MiB")
    print(f"  {save.message.strip()}")
    if skip:
        print(f"  {skip[0].message.strip()}")
    else:
        a = alloc[0]
        print(f"  cached: {a['n_tokens']} tokens, state {a['size_main'] / 2**20:.2f} MiB + "
              f"{a['n_checkpoints']} "
              f"checkpoints {a['size_ckpt'] / 2**20:.2f} MiB = {a['size'] / 2**20:.2f} MiB")
    out[name] = (len(ck), [c.n_tokens for c in ck], sum(c.size() for c in ck),
                 save.data["size_tgt"], alloc, skip)
limit = 32 * 2**20
n2, at2, ck2, tgt2, alloc2, skip2 = out["e2"]
n3, at3, ck3, tgt3, alloc3, skip3 = out["e3"]
assert (n2, at2, n3, at3) == (7, [1, 144, 163, 325, 487, 649, 656], 2, [649, 656]) and tgt2 == tgt3
assert (not alloc2 and skip2[0].data["size"] == tgt2 + ck2 > limit
        and skip2[0].data["n_tokens"] == 661)
# the prompt's state alone would fit
assert tgt2 <= limit
assert (len(alloc3) == 1 and alloc3[0]["size_ckpt"] == ck3 and alloc3[0]["n_checkpoints"] == 2
        and not skip3)
assert alloc3[0]["size"] == alloc3[0]["size_main"] + ck3 <= limit and alloc3[0]["n_tokens"] == 661"""),
    md("""The prompt's own state (the `saving prompt` line) is the same in both engines, and it would fit in
32 MiB. With seven checkpoints the entry adds their bytes to it and exceeds the limit, so the server
skips it: the chat is not cached at all (spec 2.3, step 3). With two checkpoints the entry fits and
is cached, and its size counts the checkpoints. More checkpoints buy more places to resume from, and
they cost RAM in every cache entry that carries them.

## Try this
1. Add `--swa-full`: no checkpoints are created (a live slot can be cut back anywhere), at the price of
   a full-size SWA cache. `eng.ctx.state_seq_size(0)` does not change (the state holds only the window
   either way); the KV cache the context allocates does (notebook 07, *What `--swa-full` costs*).
2. Lower `--checkpoint-min-step` to 0 and count the checkpoints of a long multi-turn chat.
3. With `e3`, send the chat prompt plus a new user turn: the cached entry comes back with its two
   checkpoints. Which one is restored?

Next in the reading order: [03 · Slot save / restore](03-save-load.ipynb), where checkpoints do not travel."""),
]
