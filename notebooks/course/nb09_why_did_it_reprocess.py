"""Notebook 09-why-did-it-reprocess: its cells (markdown and code), written by `notebooks/build_notebooks.py 09-why-did-it-reprocess`."""

from course.cells import code, md

NAME = "09-why-did-it-reprocess"

CELLS = [
    md("""# 09 · "Why did it re-process my prompt?" — hybrid models, agents, and the flag that would have helped

The loudest caching complaint about llama-server is full prompt re-processing on **hybrid and
recurrent** models (Qwen3.5/3.6, Nemotron-H, Granite 4, LFM2) behind coding agents (llama.cpp issues
#20225, #21831, #22746). Their recurrent state cannot be rolled back: any cut-back — even by one
token — needs a **context checkpoint** at or before that point (docs/server-behaviour.md 3.5).

This notebook replays three recorded scenarios on a tiny random-weight **qwen35** (hybrid) model that
llama.cpp's own `test-llama-archs` wrote (tests/models/; the real llama-server made the same decisions
on them: tests/golden/traces_tiny/). For each request that reused fewer tokens than the server held,
`slotlab.counterfactual.diagnose_trace` says where the prompt changed, which mechanism lost the rest,
and tries every flag change that acts on that mechanism by replaying the trace up to that request; it
suggests only those that reused more, best first, with the figure — never a flag that saved nothing. The tiny model's test
vocabulary renders text as odd pieces: the positions and counts are what matter here.

**Defaults in this chapter.** Each trace's own flags: `-np 1 -c 512` (the agent loop), `-c 1024` (the
changing header: auto `-np`, `4` unified slots), `-np 1 -c 256 --ctx-checkpoints 2 -cms 24 -b 64
-ub 32` (checkpoint spacing); the rest are the server's (`--ctx-checkpoints 32`, `-cms 8192`, `-ub 512`,
`--cache-ram 8192`, `-sps 0.10`)."""),
    code("""from pathlib import Path
from slotlab.engine.replay import load_trace
from slotlab.engine.scheduler import Engine
from slotlab.counterfactual import diagnose_trace
from slotlab.panel.state import PanelState

ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "tests" / "models").exists())
TINY = ROOT / "tests" / "golden" / "traces_tiny"

def trace(name):
    t = load_trace(TINY / f"{name}.json")
    # the model, from any directory
    t.flags = [str(ROOT / f) if f.endswith(".gguf") else f for f in t.flags]
    return t

eng = Engine(trace("hybrid_agent_loop").flags)
info = eng.memory.info
print(f"seq_rm {info.seq_rm_type}, can_shift {info.can_shift}, checkpoints needed: "
      f"{info.needs_checkpoints}")
assert info.seq_rm_type == "FULL" and info.needs_checkpoints and not info.can_shift
eng.close()"""),
    md("""`can_shift` is false not because of the recurrent layers (a recurrent state shifts trivially:
llama-memory-recurrent.cpp) but because Qwen3.5's attention uses M-RoPE (`LLAMA_ROPE_TYPE_IMROPE`, four
positions per embedding), which the KV cache cannot shift; a hybrid memory shifts only if its attention
part can. The server therefore switches `--cache-reuse` off at load on this model."""),
    md("""## 1. An agent loop: every turn re-processes the tail
Each turn appends the assistant's tool call and the tool's result. The slot holds the previous prompt
*and* the reply it generated, but the recurrent state has moved past them: the server can only go back
to a checkpoint, and it takes them a few tokens before each prompt's end (4 and `4 + n_ubatch`). So when
the client's next prompt does not carry the reply token for token (here the agent's tool call replaces
what the model generated), every turn loses the last 4 prompt tokens plus the reply; a client that
echoes the reply verbatim loses nothing, since the recurrent state then sits exactly where the new
prompt continues. No flag moves that checkpoint: each candidate (more checkpoints, `--checkpoint-min-step 0`) is tried and saves nothing, so none is
suggested."""),
    code("""# not asserted: the prompt / held texts (pieces of the tiny model's test vocabulary, not figures)
d1 = diagnose_trace(trace("hybrid_agent_loop"), max_misses=2)
print("\\n".join(d1.lines()))
causes = {m.cause for _, m in d1.misses}
assert causes == {"checkpoint_early"} and len(d1.misses) == 6
assert all(m.lost == 4 for _, m in d1.misses)
assert ([(m.possible, m.n_past) for _, m in d1.misses] == [(44, 40), (65, 61), (86, 82), (107, 103),
    (124, 120), (136, 132)])
assert d1.lost_by_cause == {"checkpoint_early": 24}
assert all(c.saved <= 0 for cs in d1.tried.values() for c in cs)   # no flag saves it"""),
    md("""Drawn against each turn's prompt: blue is what the server reused (`n_past`, its `cache_n`: up to the
restored checkpoint), the thin light-red band the tokens between that checkpoint and the point where the
prompt differs from what the slot held: the last 4 tokens of the previous prompt, processed again. The
prompt differs exactly where the reply began (each turn's divergence is the previous turn's prompt
length): the client replaced the reply, so it is part of the light orange, the new turn. The loss does
not grow with the conversation: it is the checkpoint's distance from the prompt's end, every turn."""),
    code("""from slotlab.figures import misses as miss_figure, png

ms = [m for _, m in d1.misses]
# diverges where the reply began
assert [m.possible for m in ms[1:]] == [m.n_prompt for m in ms[:-1]]
fig = miss_figure.requests_figure(d1.misses, title="hybrid_agent_loop: each turn's prompt tokens "
                                  "(the prompt tail lost; the reply replaced by the client)")
bars = fig.axes[0].patches                                  # per row: reused, lost, new
assert [b.get_width() for b in bars[1::3]] == [m.possible - m.n_past for m in ms]
# the new turn starts at the reply
assert [b.get_x() for b in bars[2::3]] == [m.possible for m in ms]
png.image(fig)"""),
    md("""## 2. A client that rewrites a header early in the system prompt
A timestamp or billing header near the top of the prompt changes every turn. The prompt diverges a few
tokens in; every checkpoint lies after that point, so the whole prompt is processed again. More
checkpoints do not help (tried below); keeping the first tokens stable does."""),
    code("""# not asserted: the prompt / held texts and the checkpoint lists of each line (the causes and
# counts are)
d2 = diagnose_trace(trace("hybrid_changing_header"), max_misses=2)
print("\\n".join(d2.lines()))
assert [(m.cause, m.possible, m.n_past) for _, m in d2.misses] == [
    ("no_checkpoint", 6, 0), ("no_checkpoint", 6, 0), ("threshold", 6, 0),
        ("checkpoint_early", 70, 66)]
assert d2.lost_by_cause == {"no_checkpoint": 12, "threshold": 6, "checkpoint_early": 4}
assert "checkpoints at n_tokens [25, 30]" in d2.misses[0][1].detail
assert "checkpoints at n_tokens [25, 37, 42]" in d2.misses[1][1].detail
first = d2.misses[0][1]
assert first.cause == "no_checkpoint" and first.n_past == 0
assert first.suggest[-1].startswith("keep the prompt's first")
assert d2.best(d2.misses[0][0]) is None    # more checkpoints, or -cms 0: tried, saved nothing
assert not first.flags()                     # so no flag is suggested: only the client's fix"""),
    md("""## 3. Checkpoint spacing: `--ctx-checkpoints 2` with `--checkpoint-min-step 24`
A long conversation with only two checkpoints: when the list is full the server first erases another
request's checkpoint that lies within `-cms` 24 tokens of the previous one (three times here, each at
once re-created), then the oldest (FIFO), so a branch back to an early turn finds none at or before it. The explanation names the erasures by the
cap; the counterfactual tries larger caps."""),
    code("""# not asserted: the prompt / held texts (the causes, counts and checkpoints are)
d3 = diagnose_trace(trace("hybrid_ctx_checkpoints_min_step"), max_misses=3)
print("\\n".join(d3.lines()))
assert [(i, m.cause, m.possible, m.n_past) for i, m in d3.misses] == [
    (3, "checkpoint_early", 107, 106), (4, "no_checkpoint", 58, 0), (5, "no_checkpoint", 26, 0)]
capped = [(i, m) for i, m in d3.misses if m.cause == "no_checkpoint"]
assert capped and "erased by the --ctx-checkpoints cap" in capped[0][1].detail
assert "checkpoints at n_tokens [106, 107]; 7 erased" in capped[0][1].detail
assert "checkpoints at n_tokens [56, 59]; 10 erased" in capped[1][1].detail
# best first; a cap of 4 and -cms 0 saved nothing
assert capped[0][1].suggest[0] == "--ctx-checkpoints 32"
assert {" ".join(c.flags): c.saved for c in d3.tried[capped[0][0]]} == {
    "--ctx-checkpoints 4": 0, "--ctx-checkpoints 32": 42, "--checkpoint-min-step 0": 0}
assert "--ctx-checkpoints 4" not in capped[0][1].suggest
assert "pos_min 113 >= 58" in capped[0][1].detail
assert [(d3.best(i).flags, d3.best(i).cache_n) for i,
        _ in capped] == [(["--ctx-checkpoints", "32"], 42),
                                                                      (["--ctx-checkpoints", "32"],
                                                                          10)]
print({c: n for c, n in d3.lost_by_cause.items()})
assert d3.lost_by_cause == {"checkpoint_early": 1, "no_checkpoint": 84}"""),
    md("""Request #4 branches back to token 58 while the slot's recurrent state sits at position 113 (`pos_min`
113: it cannot be cut back). The two checkpoints the cap left were taken at n_tokens 106 and 107,
after the branch point, so none can be restored and all 58 shared tokens are processed again; request
#5 the same at 26. With `--ctx-checkpoints 32` the earlier checkpoints are not erased, and the replay
reuses 42 and 10 tokens. A cap of 4 and `--checkpoint-min-step 0` were tried too and saved nothing, so
they are not suggested."""),
    code("""png.image(miss_figure.requests_figure(d3.misses,
                                      title="hybrid_ctx_checkpoints_min_step: reused, lost, new"))"""),
    md("""The panel of the same trace replayed, after its last request (the picture the live panel draws):
the slot holds two checkpoints — the cap — and the checkpoint marks show the earlier ones created
(green) and erased (red crosses) as the conversation went on; the last request, which branched back to
26, prefilled its whole prompt."""),
    code("""from slotlab.engine.replay import replay
from slotlab.panel.static import panel_image

out = replay(trace("hybrid_ctx_checkpoints_min_step"))
st = PanelState.from_bus(out["engine"].events)
# --ctx-checkpoints 2
assert [(a, b) for a, b, *_ in st.slots[0].checkpoints] == [(23, 23), (26, 26)]
assert {k for _, _, k, *_ in st.ckpt_marks} >= {"created", "evict"}
assert st.slots[0].prov[0][:2] == (0, st.slots[0].n_prompt) and st.slots[0].prov[0][2] == "prefill"
erased = [(e.data["reason"], e.data["n_tokens"]) for e in out["engine"].events.log
          if e.kind == "checkpoint_evict"]
# within -cms 24 of the previous kept one
assert [n for r, n in erased if r == "too_close"] == [42, 74, 106]
# then the oldest, as the real server did
assert sum(r == "fifo" for r, _ in erased) == 11
display(panel_image(st))
out["engine"].close()"""),
    md("""## Reading your own server
The same explanation runs on any trace: `slotlab replay my-trace.json --why` (record the trace with
`slotlab proxy`, or write it by hand), and on a real server's log the same facts come from
`slotlab watch --log server.log` (run the server with `-lv 4`). The totals line — tokens lost by
cause — is the place to start: a large `no_checkpoint` on a hybrid model says the prompt changes
before any checkpoint; `checkpoint_early` is the price of a recurrent state on every agent turn.

## Try this
1. Replay `hybrid_branch_back` and `hybrid_slot_files` from `TINY` with `diagnose_trace`.
2. Add `--slot-appendices` to the slot-file trace: slotlab's checkpoint appendix saves what the stock
   file loses.

Next: [10 · Debug your own server](10-debug-your-own-server.ipynb)."""),
]
