"""Notebook 06-checkpoints: its cells (markdown and code), written by `notebooks/build_notebooks.py 06-checkpoints`."""

from course.cells import code, md

NAME = "06-checkpoints"

CELLS = [
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
