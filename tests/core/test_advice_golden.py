"""Advice that is right, on every golden trace with a miss: no flag in any suggestion fails its own
counterfactual (issue 23, item 3).

`diagnose_trace` tries every flag change that acts on each miss's mechanism and keeps only those that
reused more. This test checks that from outside: each suggested flag is replayed again, on a fresh
engine, with the trace up to the missed request, and must reuse more than the miss did — by the figure
the suggestion carries. The traces recorded from the real llama-server on Gemma 3 (tests/golden/traces)
run on the paper memory with the server's recorded answers scripted (exact on every one of them:
tests/sim/test_paper_golden.py); the tiny hybrid / recurrent ones (traces_tiny) on the real engine with
their tiny models. `test_counts` prints how many tried changes were dropped and how many remain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlab.counterfactual import diagnose_trace, flag_change, paper_replayer
from slotlab.engine.replay import Trace, load_trace, replay
from slotlab.sim.paper_replay import recorded_outputs
from tests.golden.trace_models import split_model

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
SWA = sorted(p.stem for p in (GOLDEN / "traces").glob("*.json") if ".llama-server" not in p.name)
TINY = sorted(p.stem for p in (GOLDEN / "traces_tiny").glob("*.json") if ".llama-server" not in p.name)
COUNTS: dict[str, tuple[int, int, list]] = {}


def _setup(kind: str, name: str, model):
    d = GOLDEN / kind
    trace = load_trace(d / f"{name}.json")
    if kind == "traces":
        trace.flags = [*trace.flags, "--no-slot-appendices"]  # the stock server's slot files, as recorded
        outputs = recorded_outputs(json.loads((d / f"{name}.llama-server.json").read_text()), model)
        return trace, paper_replayer(trace, vocab=model, outputs=outputs)
    path, rest = split_model(trace.flags)
    trace.flags = ["-m", str(path), *rest]
    return trace, (lambda t: replay(t))


def _check(kind: str, name: str, model) -> None:
    trace, run = _setup(kind, name, model)
    diag = diagnose_trace(trace, replayer=run, max_misses=100)
    kept = []
    for i, m in diag.misses:
        assert m.tested and not m.untested, (name, i, m.line())
        tried = {" ".join(c.flags): c for c in diag.tried[i]}
        for s in m.suggest:
            fl = flag_change(s)
            if fl is None:
                continue
            assert s in tried and tried[s].saved > 0 and m.saved[s] == tried[s].saved, (name, i, s)
            # from outside: the trace up to this request, with the change, on a fresh engine
            out = run(Trace([*trace.flags, *fl], trace.requests[:i + 1], trace.path, trace.files))
            out["engine"].close()
            cn = out["results"][i]["cache_n"] or 0
            assert cn - m.n_past == m.saved[s] > 0, (name, i, s, cn, m.n_past)
            kept.append((i, m.cause, s, m.saved[s]))
        flags = m.flags()
        assert flags == sorted(flags, key=lambda f: -m.saved[f])  # best first
        for c in diag.tried[i]:  # what saved nothing is never advised
            if c.saved <= 0:
                assert " ".join(c.flags) not in m.suggest
    doc = diag.as_json()
    for m in doc["misses"]:  # the JSON's promise: a suggested flag is in `tried` with saved > 0
        saved = {" ".join(c["flags"]): c["saved"] for c in m["tried"]}
        assert all(saved.get(s, 0) > 0 for s in m["suggest"] if flag_change(s) is not None)
    COUNTS[f"{kind}/{name}"] = (len(diag.dropped()), len(kept), kept)


@pytest.mark.parametrize("name", SWA)
def test_golden_advice_is_confirmed(model, name):
    _check("traces", name, model)


@pytest.mark.parametrize("name", TINY)
def test_tiny_golden_advice_is_confirmed(model, name):
    _check("traces_tiny", name, model)


def test_counts(capsys):
    """The figures of the report (run with the tests above; -s shows them)."""
    if not COUNTS:
        pytest.skip("run with the golden advice tests")
    dropped = sum(d for d, _, _ in COUNTS.values())
    kept = [k for _, _, ks in COUNTS.values() for k in ks]
    with capsys.disabled():
        print(f"\n{len(COUNTS)} golden traces: {dropped} tried flag changes saved nothing (dropped), "
              f"{len(kept)} suggestions remain")
        for name, (_, _, ks) in sorted(COUNTS.items()):
            for i, cause, s, n in ks:
                print(f"  {name} #{i} {cause}: {s} +{n}")
