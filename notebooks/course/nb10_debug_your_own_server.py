"""Notebook 10-debug-your-own-server: its cells (markdown and code), written by `notebooks/build_notebooks.py 10-debug-your-own-server`."""

from course.cells import code, md

NAME = "10-debug-your-own-server"

CELLS = [
    md("""# 10 · Debug your own server: from llama-server's log to the cause of a miss

Everything earlier in the course ran slotlab's engine. This chapter reads **the real llama-server's
own log** — the lines it prints at `-lv 4` — and explains each miss from those lines alone, with the
same explanations (`slotlab.explain`) the engine's events get. The logs here were recorded from the
real `llama-server` of the pinned llama.cpp (tests/golden/traces/*.llama-server.log, recorded by
tests/golden/record_traces.py); yours come from

    llama-server -m MODEL.gguf -lv 4 --log-file server.log   # plus your usual flags
    slotlab watch --log server.log --why

A *miss* is a request that reused fewer tokens than the server held for it (in a slot or in a RAM
cache entry). A log names no tokens, so what it can explain is what its numbers say.

**Defaults in this chapter.** The server logs at `-lv 3` (INFO) by default: the slot choice
(`selected slot by ...`) shows there, but the RAM-cache and checkpoint lines this chapter reads
(`- looking for better prompt`, `created context checkpoint`, `restored context checkpoint`) are TRC
and need `-lv 4`. Each recorded scenario runs its own flags (tests/golden/traces/NAME.json), on the
server's defaults otherwise."""),
    md("""## The lines that matter

| the server prints (`-lv 4`) | what it means | cause | the flag that changes it |
|---|---|---|---|
| `selected slot by LRU` after `lcp = L, ... f_sim ≤ thold` for another slot | a slot held `L` tokens but its similarity was not above `-sps` | `threshold` | a lower `-sps` |
| `- looking for better prompt` / `- prompt with length N, lcp = L, f_keep, f_sim` | the RAM cache was searched; each entry's two ratios | `floor` (f_keep < 0.25) or `two_axis` (did not beat the best on both ratios) | none moves the floor; a bigger `--cache-ram` only where entries were evicted for room |
| `forcing full prompt re-processing due to lack of cache data` | SWA / recurrent memory cannot be cut back and no checkpoint was at or before the cut | `no_checkpoint` | `--swa-full` (an SWA model; it helps a live slot only: a slot restored from the RAM cache or a file keeps only its window, notebook 01), `--ctx-checkpoints` (where the cap erased some) |
| `restored context checkpoint (..., n_past = P)` with `P` below the common prefix | a checkpoint saved part of it; the rest is processed again | `checkpoint_early` | `--swa-full` (an SWA model); `--checkpoint-min-step` only where message delimiters put checkpoints at user messages |
| `erased invalidated context checkpoint` | checkpoints after the cut are gone | (follows the two above) | — |
| `- cache state: N prompts, X MiB (limits: ...)` | the RAM cache after an update: what it holds | — | `--cache-ram` |
| `purging slot` / `failed to find free space in the KV cache` | KV pressure: a slot emptied for room | dropped (the engine sees it; a log shows no tokens) | `-np`, `-c`, `-kvu` |

The rule behind `no_checkpoint` (docs/server-behaviour.md 3.5): with SWA or recurrent memory, once
the slot's oldest kept position `pos_min` is at or past `max(0, pos_next − n_swa)`, the memory cannot
be cut back to `pos_next` at all; the server then looks for a checkpoint at or before the cut, and
without one it starts again from token 0.

A log cannot be replayed, so the explanation offers no flag as advice: it keeps, as data
(`Miss.untested`), the changes whose precondition the log shows (`--swa-full` for an SWA model, `-cms`
only with checkpoints at user messages, `--cache-ram` only where an entry was evicted for room), and
its line says how to test them: record the traffic (`slotlab proxy --record session.jsonl`) and
`slotlab simulate session.jsonl --why` runs the whole session with every candidate and prints only
those that saved tokens, with the amount."""),
    code("""from pathlib import Path
import collections
from slotlab.watch.report import read, misses
from slotlab.explain import NOT_TESTED

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "tests" / "golden").exists())
LOGS = ROOT / "tests" / "golden" / "traces"

def explain(name):
    reader, events = read(LOGS / f"{name}.llama-server.log")
    found, lost = misses(events)
    return events, found, lost

def lines_of(events, task, kinds=None):
    \"\"\"The server's own lines for one request (the reader keeps each line's text on its event).\"\"\"
    return [e.message.strip() for e in events if e.task == task and e.message
            and (kinds is None or e.kind in kinds)]"""),
    md("""## 1. `threshold`: the slot that held the prompt was not similar enough
`-sps 0.9` asks for 90 % of the prompt in common before a slot is chosen by similarity. Slot 1 held
127 of the 211 tokens (f_sim 0.60): not enough, so the least recently used slot got the request and
processed everything."""),
    code("""events, found, lost = explain("sps_high")
(i, m), = found
server = lines_of(events, m.task, {"slot_sim", "slot_selected_by_lru", "prompt_seq_rm"})
print("\\n".join(server))
print("why:", m.line())
assert server[0] == "- checking sim = 0.602 (127/211) > 0.900"
assert (m.cause == "threshold" and (m.possible, m.lost) == (127, 127)
        and m.untested[0] == "-sps 0.59")
# a log tests nothing: no flag is advice
assert "try -sps" not in m.line() and NOT_TESTED in m.line()
assert "f_sim 0.60, not above -sps 0.90" in m.detail"""),
    md("""## 2. `floor` and `two_axis`: the RAM cache held it, the search passed it by
The search keeps an entry only if its `f_keep` (share of the entry reused) is at least 0.25 and it
beats the best so far on **both** `f_keep` and `f_sim`. In this log request #2 shares 7 tokens with a
150-token entry (f_keep 0.05: below the floor), and request #3's best entry (177 tokens in common,
f_sim 0.90) loses to an earlier one with a higher f_keep but only 111 tokens in common."""),
    code("""events, found, lost = explain("two_axis_order_ab")
server = {}
for i, m in found:
    server[i] = lines_of(events, m.task,
                         {"cache_load_base", "cache_load_score", "cache_load_found"})
    print(f"request #{i}:")
    print("   " + "\\n   ".join(server[i]))
    print("   why:", m.line())
assert server[2] == ["- looking for better prompt, base f_keep = -1.000, f_sim = 0.000",
                     "- prompt with length     150, lcp =       7, f_keep = 0.047, f_sim = 0.108"]
assert server[3][1:] == ["- prompt with length     150, lcp =     111, f_keep = 0.740, f_sim = "
                         "0.563",
                         "- prompt with length     630, lcp =     177, f_keep = 0.281, f_sim = "
                         "0.898",
                         "- found better prompt with f_keep = 0.740, f_sim = 0.563"]
assert ("(f_keep 0.05 < 0.25)" in found[0][1].detail
        and "(f_keep 0.28, f_sim 0.90)" in found[1][1].detail)
causes = [m.cause for _, m in found]
assert causes == ["floor", "two_axis"]
assert found[0][1].lost == 7 and found[1][1].lost == 66 and lost == {"two_axis": 66, "floor": 7}"""),
    md("""## 3. `no_checkpoint` and `checkpoint_early`: SWA memory and context checkpoints
Gemma 3 270M, the model these logs come from, has a 512-token sliding window (1,024 on Gemma 3 4B and
larger). Without `--swa-full` a slot cannot be cut back once its window has moved past the cut, and context checkpoints (copies of the SWA state taken 4 + n_ubatch and 4 tokens before
each prompt's end, and, on chat requests with message delimiters, at user-message starts more than
`--checkpoint-min-step` apart) are the only way back. Here the third request diverges at token 209 while every
checkpoint ends later (562, 1032): the whole prompt is processed again. The next request restores a
checkpoint that ends 5 tokens short of the divergence: those 5 are processed again."""),
    code("""events, found, lost = explain("swa_checkpoints_diverge")
server = {}
for i, m in found:
    server[i] = [ln[:140] for ln in lines_of(events, m.task, {"checkpoint_check", "checkpoint_none",
                                                              "checkpoint_restored",
                                                                  "checkpoint_evict"})]
    print(f"request #{i}:")
    print("   " + "\\n   ".join(server[i]))
    print("   why:", m.line())
(i3, m3), (i4, m4) = found
assert ((i3, m3.task, m3.cause, m3.lost) == (3, 15, "no_checkpoint", 209)
        and "checkpoints at n_tokens [562, 1032]" in m3.detail)
assert (i4, m4.task, m4.cause, m4.possible, m4.lost) == (4, 20, "checkpoint_early", 212, 5)
assert (server[3][:2] == ["checking checkpoint with [62, 1031] against 0...",
                          "checking checkpoint with [0, 561] against 0..."])
assert "(pos_min = 0, pos_max = 561, n_tokens = 562, n_swa = 512, pos_next = 0," in server[3][3]
assert "(pos_min = 62, pos_max = 1031, n_tokens = 1032, n_swa = 512, pos_next = 0," in server[3][4]
assert (server[4][1].startswith("restored context checkpoint (pos_min = 0, pos_max = 207, n_tokens "
                                "= 208, n_past = 207,"))"""),
    md("""The two misses against their prompts: request #3 reused nothing of the 209 tokens it shared with the
slot, request #4 reused up to the restored checkpoint (`n_past` 207) and lost the 5 tokens after it.
The second picture is the panel folded from this log alone (`PanelState.rebuild(events)`: the same
figure the live panel draws when `slotlab watch` feeds it), after request #4: the slot's tokens up to
207 came from the checkpoint, the rest was prefilled up to and past the divergence, then generated."""),
    code("""from slotlab.figures import misses as miss_figure, png
from slotlab.panel.state import PanelState
from slotlab.panel.static import panel_image

display(png.image(miss_figure.requests_figure(found,
                                              title="swa_checkpoints_diverge.llama-server.log")))
st = PanelState.rebuild(events)
kinds = {k: (a, b) for a, b, k in st.slots[0].prov}
assert kinds["checkpoint"] == (0, 207) and st.slots[0].divergence == 212
display(panel_image(st))"""),
    md("""## 4. Every recorded log at once
The same reading over all 33 recorded logs: the tokens lost by cause. These logs are the test fixtures
(tests/golden/traces/, recorded by tests/golden/record_traces.py), one scenario each, built to trigger
one mechanism: the totals show which causes the reader recognises in a real server's log, not how often
each happens in real traffic. Five distinct causes show in real logs;
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
n_logs = len(list(LOGS.glob("*.llama-server.log")))
print(f"{n_logs} llama-server logs")
for cause, n in total.most_common():
    print(f"{cause:18} {n:6} tokens lost  in {len(set(per_cause[cause]))} logs, "
          f"e.g. {per_cause[cause][0]}")
assert n_logs == 33
assert len(total) >= 4 and set(total) == {"no_checkpoint", "threshold", "checkpoint_early", "floor", "two_axis"}
assert dict(total) == {"no_checkpoint": 5383, "checkpoint_early": 637, "threshold": 203, "two_axis": 66, "floor": 21}
assert total.most_common(1)[0][0] == "no_checkpoint\""""),
    md("""As a picture (a log scale: `no_checkpoint` dwarfs the rest, yet each cause costs real requests):"""),
    code("""png.image(miss_figure.by_cause_figure(dict(total),
                                      n_logs={c: len(set(v)) for c, v in per_cause.items()},
                                      title=f"tokens lost by cause, the {n_logs} test-fixture "
                                      f"llama-server logs (one scenario each)"))"""),
    md("""## Your own server, step by step
1. Run it with `-lv 4 --log-file server.log` (`-lv 3` hides the similarity, cache and checkpoint
   lines; the reader then says what it cannot see).
2. `slotlab watch --log server.log --why`: per request the slot, cached and prefilled tokens, then each
   miss with its cause (no flag: a log has no prompts to test one on) and the tokens lost by cause. `--json` gives the same as data.
3. Live: `slotlab watch -- llama-server ARGS... -lv 4` starts the server and prints each decision as it
   happens; `--twin` runs slotlab beside it and reports the first decision that differs.
4. To try a flag on your traffic, record it (`slotlab proxy --upstream URL --record session.jsonl
   --flags "..."`) and run `slotlab simulate session.jsonl --why`: every flag that acts on a miss and
   every client fix is run over the whole session, and only those that saved tokens are printed, with
   the amount (`slotlab replay trace.json --why` does the same per miss on a trace); `slotlab simulate` and
   `slotlab whatif` (notebook 08) answer the same question at production scale without a model.

## Try this
1. Read `defaults_single_slot_checkpoints`: which flags act on its miss (`Miss.untested`), and what
   does `slotlab replay tests/golden/traces/defaults_single_slot_checkpoints.json --why --memory paper`
   find when it tries them?
2. Strip the TRC / DBG lines from a log (what `-lv 3` prints) and read it again: which causes remain?

Next: [11 · Recipes](11-recipes.ipynb): the flags and client rules for three kinds of model."""),
]
