"""Misses explained from a real llama-server log (`slotlab watch --log FILE --why`).

A log names no tokens, so the reader rebuilds what the server held from the numbers it prints at
-lv 4: each idle slot's lcp (similarity lines), each RAM entry's lcp when a load listed them, the
checkpoint chain and the forced re-processing / restored checkpoint lines. The explanations are the
same fold (slotlab.explain) the engine's events get: for every golden trace, each miss the log
explains is the miss the engine's replay explains for that request, with the same cause and the same
number of tokens lost."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slotlab.explain import Explainer
from slotlab.watch.report import misses, read
from tests.golden.replayed import TRACES, replayed

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"


def load_flags(name: str) -> list:
    return json.loads((DIR / f"{name}.json").read_text())["flags"]


def log_misses(name: str) -> dict:
    _, events = read(DIR / f"{name}.llama-server.log")
    found, _ = misses(events)
    return {i: m for i, m in found}


def test_real_logs_show_at_least_four_causes():
    causes = collections.Counter(m.cause for name in TRACES for m in log_misses(name).values())
    assert {"no_checkpoint", "checkpoint_early", "threshold", "floor", "two_axis"} <= set(causes), causes


@pytest.mark.parametrize("name", TRACES)
def test_log_explains_a_miss_as_the_engine_does(name, model):
    from_log = log_misses(name)
    events = replayed(name, model).events
    x = Explainer().fold(events)
    order = {t: i for i, t in enumerate(e.task for e in events if e.kind == "prompt_plan")}
    from_engine = {order[m.task]: m for m in x.misses}
    for i, m in from_log.items():
        assert i in from_engine, f"{name} #{i}: the log says {m.cause} ({m.lost} lost); the engine saw no miss"
        e = from_engine[i]
        if e.cause in ("dropped", "slot_kept"):  # what a log cannot show (above)
            continue
        if (m.cause, m.lost, m.possible) != (e.cause, e.lost, e.possible):
            assert "-sps', '0'" in str(load_flags(name)) or e.cause == "pinned", (name, i, m.line(), e.line())
            assert (m.lost, m.possible) == (e.lost, e.possible), (name, i, m.line(), e.line())


def test_watch_why_prints_causes_and_totals():
    log = DIR / "two_axis_order_ab.llama-server.log"
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "watch", "--log", str(log), "--why"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert any(ln.startswith("#2 ") and "f_keep 0.05 < 0.25" in ln for ln in lines), out
    assert any(ln.startswith("#3 ") and "did not beat the slot or an earlier entry" in ln for ln in lines), out
    # the totals close the explanations; only notes (a server log has no chat messages) follow them
    body = [ln for ln in lines if not ln.startswith("note: ")]
    assert body[-1] == "tokens lost by cause: two_axis 66, floor 7"
    assert any(ln.startswith("note: a server log carries no chat messages") for ln in lines[lines.index(body[-1]):])
