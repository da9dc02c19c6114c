"""`slotlab replay --memory paper` on the tiny hybrid and recurrent golden traces (tests/golden/traces_tiny/):
the qwen35 (attention + gated delta net) and mamba2 (recurrent) models of tests/models/, recorded from the
real llama-server. The paper memory (no tensors, nothing decoded, state blobs as PaperBlobs of the real
size) must give what the server gave, compared exactly as tests/sim/test_paper_golden.py compares the
Gemma traces: per request slot, cache_n, prompt_n, tokens_evaluated, tokens_cached, status and error;
per slot action the reply (timings excepted); and the -lv 4 log's sequence of RAM-cache / checkpoint /
purge / retry decisions with their MiB, token and f_keep / f_sim figures.

On these models every reuse goes through a context checkpoint (seq_rm FULL: the recurrent state holds
only its last position), so the checkpoints' sizes (the recurrent state: r / s rows of every recurrent
layer) and the `pos_min` the hybrid memory reports (the larger of its parts' minimums) decide what is
restored, and are what this proves on paper.

Two modes, as for the Gemma traces: placeholders (the paper sampler's ids) and scripted (each request
generates the tokens of the server's recorded answer, re-tokenized). The text prompts are tokenized with
the tiny model's own vocabulary."""

import json
from pathlib import Path

import pytest

from slotlab.engine.replay import load_trace
from slotlab.engine.server_log import decisions, decisions_of_engine
from slotlab.memory.paper import PaperBlob
from slotlab.sim.paper_replay import recorded_outputs, replay_on_paper
from tests.golden.trace_models import split_model

DIR = Path(__file__).resolve().parents[1] / "golden" / "traces_tiny"
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)

# traces whose decisions depend on what the model wrote (named with why), in placeholder mode only
GENERATED_CONTENT: dict[str, str] = {}


def _strip(result: dict, content: bool = False) -> dict:
    r = dict(result)
    if not content:
        r.pop("content", None)
    if isinstance(r.get("reply"), dict):
        r["reply"] = {k: v for k, v in r["reply"].items() if k != "timings"}
    return r


def _run(name: str, model_of, scripted: bool):
    want = json.loads((DIR / f"{name}.llama-server.json").read_text())
    trace = load_trace(DIR / f"{name}.json")
    path, rest = split_model(trace.flags)
    trace.flags = ["-m", str(path), *rest, "--no-slot-appendices"]  # the model wherever pytest runs from
    model = model_of(path)
    outputs = recorded_outputs(want, model) if scripted else None
    out = replay_on_paper(trace, model=model, outputs=outputs)
    theirs = decisions((DIR / f"{name}.llama-server.log").read_text().splitlines())
    return want, out, theirs


def _diffs(want, out, theirs, content: bool) -> list[str]:
    diffs = []
    got = [_strip(r, content) for r in out["results"]]
    exp = [_strip(r, content) for r in want["results"]]
    if len(got) != len(exp):
        diffs.append(f"{len(got)} results, want {len(exp)}")
    diffs += [f"request {i}: {g} != {w}" for i, (g, w) in enumerate(zip(got, exp)) if g != w]
    ours = decisions_of_engine(out["engine"])
    if ours != theirs:
        i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        diffs.append(f"decision {i}: {ours[i:i + 1]} != {theirs[i:i + 1]} ({len(ours)} vs {len(theirs)})")
    return diffs


def test_every_tiny_trace_is_here():
    # the 22 of issue 22 and the slot-action scenario on each model (issue 20)
    assert len(TRACES) == 24 and {t.split("_")[0] for t in TRACES} == {"hybrid", "recurrent"}
    assert {"hybrid_slot_actions", "recurrent_slot_actions"} <= set(TRACES)


@pytest.mark.parametrize("name", TRACES)
def test_paper_replay_matches_server(model_of, name):
    want, out, theirs = _run(name, model_of, scripted=False)
    eng = out["engine"]
    try:
        diffs = _diffs(want, out, theirs, content=False)
        if name in GENERATED_CONTENT:
            assert diffs, f"{name} now matches with placeholder tokens: drop it from GENERATED_CONTENT"
        else:
            assert not diffs, f"{name}: " + "; ".join(diffs[:3])
        for e in eng.cache.entries if eng.cache is not None else ():
            assert isinstance(e.main, PaperBlob)  # the cache held sizes, not bytes
            assert all(isinstance(c.data_tgt, PaperBlob) for c in e.checkpoints)
    finally:
        eng.close()


@pytest.mark.parametrize("name", TRACES)
def test_paper_replay_with_recorded_answers(model_of, name):
    """The answers' tokens in the slots' caches (as the server held them) change no decision either.
    Content is not compared: the tiny test vocabulary does not tokenize a detokenized answer back to
    the tokens the model sampled (the real-model replay, tests/golden/test_golden.py, strips it too)."""
    want, out, theirs = _run(name, model_of, scripted=True)
    try:
        diffs = _diffs(want, out, theirs, content=False)
        assert not diffs, f"{name}: " + "; ".join(diffs[:3])
    finally:
        out["engine"].close()
