"""`--why`'s counterfactuals run on the paper memory for every memory kind (issue 22 item 2): on every
tiny hybrid (qwen35) and recurrent (mamba2) golden trace, the trace is replayed on the real model, its
misses found, and every flag change that acts on each miss is replayed twice — on a fresh real context
(`counterfactuals="real"`) and on the paper memory with each request generating the tokens it
generated in the real replay (the default). The two diagnoses must be equal field for field: per miss
its cause, what it lost, every tried change's cache_n / saved / error, the advice kept and its figures;
the totals by cause; the client changes.

The real side runs `-t 1`: the thread count changes no decision, and two llama.cpp threads on these
shared 2-core machines spin at every barrier while their partner is descheduled (a full replay of
hybrid_agent_loop took 6-26 s with the default threads, 0.45 s with one, measured back to back), which
would make the real side look slower than it is. `test_paper_counterfactuals_are_faster` compares the
wall time of the counterfactual replays over the traces that ran (-s prints the figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlab.counterfactual import diagnose_trace
from slotlab.engine.replay import load_trace
from tests.golden.trace_models import split_model

DIR = Path(__file__).resolve().parents[1] / "golden" / "traces_tiny"
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)
SEEN: dict[str, tuple[int, float, float, int]] = {}  # trace -> (replays, real s, paper s, changes that saved)


@pytest.mark.parametrize("name", TRACES)
def test_paper_counterfactuals_equal_the_real_ones(model_of, name):
    trace = load_trace(DIR / f"{name}.json")
    path, rest = split_model(trace.flags)
    trace.flags = ["-m", str(path), *rest, "-t", "1"]
    model = model_of(path)
    real = diagnose_trace(trace, model=model, counterfactuals="real", max_misses=100)
    paper = diagnose_trace(trace, model=model, max_misses=100)
    assert (real.counterfactual_memory, paper.counterfactual_memory) == ("real", "paper")
    assert paper.n_replays == real.n_replays
    a, b = real.as_json(), paper.as_json()
    for i, (x, y) in enumerate(zip(a["misses"], b["misses"])):
        assert x == y, f"{name}, miss {i} (request {x['request']}): real {x['tried']} != paper {y['tried']}"
    assert a == b
    for i, m in paper.misses:
        assert m.tested, (name, i)
    saved = sum(1 for cs in paper.tried.values() for c in cs if c.saved > 0)
    SEEN[name] = (paper.n_replays, real.counterfactual_seconds, paper.counterfactual_seconds, saved)


def test_paper_counterfactuals_are_faster(capsys):
    if len(SEEN) < 10:
        pytest.skip("run with the comparison above (at least 10 traces)")
    n = sum(v[0] for v in SEEN.values())
    real = sum(v[1] for v in SEEN.values())
    paper = sum(v[2] for v in SEEN.values())
    saved = sum(v[3] for v in SEEN.values())
    with capsys.disabled():
        print(f"\n{len(SEEN)} tiny golden traces, {n} counterfactual replays ({saved} changes saved tokens): "
              f"real context {real:.1f} s, paper {paper:.1f} s ({real / paper:.1f}x)")
        for k, (r, a, b, s) in sorted(SEEN.items()):
            print(f"  {k}: {r} replays, real {a:.2f} s, paper {b:.2f} s")
    assert n > 0 and saved > 0  # the comparison above compared tried changes, some of which saved tokens
    assert paper < real


def test_replay_why_runs_its_counterfactuals_on_paper(tmp_path, capsys):
    """`slotlab replay TRACE --why --json` (the real model replays the trace; the counterfactuals on
    paper, the default) prints what `--counterfactuals real` prints."""
    from slotlab.cli import main

    doc = json.loads((DIR / "hybrid_ctx_checkpoints_min_step.json").read_text())
    path, rest = split_model(doc["flags"])
    assert not doc.get("files")
    doc["flags"] = ["-m", str(path), *rest, "-t", "1"]  # -t 1: see the module docstring
    (tmp_path / "t.json").write_text(json.dumps(doc))
    argv = ["replay", str(tmp_path / "t.json"), "--why", "--json"]
    assert main(argv) == 0
    paper = json.loads(capsys.readouterr().out)
    assert main([*argv, "--counterfactuals", "real"]) == 0
    real = json.loads(capsys.readouterr().out)
    assert paper == real and paper["misses"]
    assert any(c["saved"] > 0 for m in paper["misses"] for c in m["tried"])  # a change that saved tokens compared


def test_a_model_paper_cannot_size_gets_real_counterfactuals(model_of, tmp_path, monkeypatch):
    """The paper memory refuses an architecture it cannot size (ModelProfile.unsized); the
    counterfactuals of such a model run on the real one, and the diagnosis says so."""
    from types import SimpleNamespace

    import slotlab.counterfactual as cf
    from tests.memory.test_paper_memory import _gguf

    _gguf(tmp_path / "k.gguf", {"general.architecture": "kimi-linear", "kimi-linear.block_count": 4,
                                "kimi-linear.context_length": 4096, "kimi-linear.embedding_length": 256,
                                "kimi-linear.attention.head_count": 4})
    why = cf._unsized(SimpleNamespace(path=tmp_path / "k.gguf"))
    assert why.startswith("kimi-linear: slotlab cannot size this hybrid memory")
    assert cf._unsized(model_of(split_model(load_trace(DIR / "recurrent_two_agents_np2.json").flags)[0])) == ""
    trace = load_trace(DIR / "recurrent_two_agents_np2.json")
    path, rest = split_model(trace.flags)
    trace.flags = ["-m", str(path), *rest, "-t", "1"]
    paper = diagnose_trace(trace, model=model_of(path))
    monkeypatch.setattr(cf, "_unsized", lambda vocab: why)  # as if the tiny mamba2 were kimi-linear
    real = diagnose_trace(trace, model=model_of(path))
    assert real.counterfactual_memory == f"real ({why})" and paper.counterfactual_memory == "paper"
    assert real.as_json() == paper.as_json() and real.n_replays == paper.n_replays > 0
