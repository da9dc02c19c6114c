"""Notebook 07-tune-your-server: its cells (markdown and code), written by `notebooks/build_notebooks.py 07-tune-your-server`."""

from course.cells import code, md

NAME = "07-tune-your-server"

CELLS = [
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
