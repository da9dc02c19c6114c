"""Every golden trace's real llama-server log (-lv 4) read by the log reader gives back what the server
answered (NAME.llama-server.json): per request the slot, cache_n, prompt_n, tokens_evaluated,
tokens_cached, status and error, and the slot actions the log shows (erases, failed restores, and the
successful restores it reveals, with what it lacks named: tests/watch/golden_rows.py). No model, no server: CI runs it.

Also: every typed event matches its schema, the events carry the log's own texts (the RAM-cache
decision list `server_log.decisions` reads from the log equals the one read from the events'
messages), and a log without its TRC / DBG lines (what `-lv 3` prints) still gives every completion."""

import json
from pathlib import Path

import pytest

from slotlab.engine import event_types as T
from slotlab.engine.events import EventBus
from slotlab.engine.server_log import decisions
from slotlab.watch.lines import parse_line
from slotlab.watch.log_reader import LOG, LogReader, requests_json
from slotlab.watch.patterns import match
from tests.watch.golden_rows import agrees, known, shown, strip, unlogged_fit

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)


def expected(name: str, completions_only: bool = False) -> list[dict]:
    """The server's answers the log can show (tests/watch/golden_rows.py: all but successful saves,
    refused file names and restores nothing after them reveals)."""
    tr = json.loads((DIR / f"{name}.json").read_text())
    res = json.loads((DIR / f"{name}.llama-server.json").read_text())["results"]
    return [r for r in shown(tr, res) if not (completions_only and "action" in r)]


def test_there_are_golden_traces():
    assert len(TRACES) >= 29


@pytest.mark.parametrize("name", TRACES)
def test_log_gives_the_servers_answers(name):
    rd = LogReader()
    events = rd.read_file(DIR / f"{name}.llama-server.log")
    got = [strip(r) for r in requests_json(events)]
    tr = json.loads((DIR / f"{name}.json").read_text())
    res = json.loads((DIR / f"{name}.llama-server.json").read_text())["results"]
    assert unlogged_fit(tr, res, got) is None, unlogged_fit(tr, res, got)
    got = known(got)
    want = expected(name)
    for i, (g, w) in enumerate(zip(got, want)):
        assert agrees(g, w), f"{name}: result {i} differs: {g} != {w}"
    assert len(got) == len(want)
    assert rd.problems == [] and rd.n_resyncs == 0


@pytest.mark.parametrize("name", TRACES)
def test_events_match_the_schema_and_carry_the_logs_texts(name):
    bus = EventBus(max_log=None)
    rd = LogReader(bus)
    path = DIR / f"{name}.llama-server.log"
    events = rd.read_file(path)
    assert rd.problems == []  # a block whose fields do not make its kind's payload would be reported here
    typed = [e for e in events if e.kind != LOG]
    assert [e.kind for e in bus.log] == [e.kind for e in events]  # plain lines reach the bus too (kind "log")
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(isinstance(e.payload, T.REGISTRY[e.kind]) for e in typed)
    assert decisions(path.read_text().splitlines()) == decisions(e.message for e in events if e.message)
    kinds = {e.kind for e in typed}
    assert {T.INIT, T.TASK_LAUNCHED, T.TASK_DONE, T.PROMPT_PLAN, T.SLOT_DECISION, T.SLOT_SNAPSHOT} <= kinds


def level_of(line: str) -> str | None:
    """The level the server logs a line at (TRC prints with the letter I), None for an unknown line."""
    ln = parse_line(line)
    hit = match(ln.src, ln.msg) if ln.src else None
    return hit[2] if hit else None


@pytest.mark.parametrize("name", TRACES)
def test_default_verbosity_still_gives_every_completion(name):
    """Without its TRC and DBG lines the log still has the launch, the timings and the release lines
    (INF): slot, prompt_n and tokens_cached are read, tokens_evaluated and cache_n are derived."""
    lines = (DIR / f"{name}.llama-server.log").read_text().splitlines(True)
    kept = [ln for ln in lines if level_of(ln) not in ("TRC", "DBG")]
    assert len(kept) < len(lines)
    rd = LogReader()
    events = [e for ln in kept for e in rd.feed(ln)] + rd.flush()
    got = [strip(r) for r in requests_json(events) if "action" not in r]
    assert got == expected(name, completions_only=True)
    assert not any(e.kind == T.CACHE_ALLOC for e in events)  # the saves are TRC lines
