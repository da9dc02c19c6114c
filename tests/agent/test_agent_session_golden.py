"""The agent session recorded through `slotlab proxy` in front of the reference llama-server b11312
(tests/agent/record_agent_session.py: the real openai and anthropic SDKs, six interleaved
conversations, every kind of client change), analysed as a user would: `slotlab simulate --why` on
the session log alone (the flags from its header). The driver's truth (truth.json) is only read here.

* slotlab's run of the recording gives every call the slot, cache_n and prompt_n the server's own log
  shows (`slotlab watch --log`): 16,125 tokens prefilled, as the server did;
* the conversations are the driver's, every change is named at its call and message and priced against
  a stable client, no plain turn is reported, and only advice that saved tokens over the whole session
  is printed (tests/agent/check.py), each advised flag giving exactly its figure when run on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.agent.check import analyse, check, confirm_advice, slotlab, tools_render

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "agent"


@pytest.fixture(scope="module")
def analysed():
    return analyse(GOLDEN / "session.jsonl")


def test_the_recording_replays_as_the_server_ran_it(analysed):
    doc, _, _ = analysed
    from slotlab.sim.traces import session_log_header

    h = session_log_header(GOLDEN / "session.jsonl")  # what the proxy kept of the server
    assert h["flags"] == ["-c", "8192", "-np", "2", "--cache-ram", "256"]
    assert h["server"]["build"].startswith("b11312") and h["server"]["total_slots"] == 2
    w = slotlab("watch", "--log", str(GOLDEN / "server.log"), "--json")
    assert w.returncode == 0, w.stderr[-2000:]
    server = json.loads(w.stdout)["results"]
    assert len(server) == len(doc["results"]) == 26
    got = [(r["id_slot"], r["cache_n"], r["prompt_n"]) for r in doc["results"]]
    assert got == [(r["id_slot"], r["cache_n"], r["prompt_n"]) for r in server]
    assert doc["totals"]["tokens_prefilled"] == sum(r["prompt_n"] for r in server)


def test_every_change_is_named_priced_and_only_tested_advice_is_given(analysed):
    doc, text, err = analysed
    truth = json.loads((GOLDEN / "truth.json").read_text())["calls"]
    cost = check(doc, text, err, truth, tools_visible=tools_render(GOLDEN / "session.jsonl"))
    assert cost["system_changed"] > 9000  # the clock: the biggest loss, named at every turn
    confirm_advice(GOLDEN / "session.jsonl", doc)


def test_the_report_shows_the_same_prices_and_advice(analysed):
    """`slotlab report` (the calls replayed one at a time, as made): the same stable-client prices per
    call as `simulate --why` (the session's calls never overlapped), and the same tested advice."""
    doc, _, _ = analysed
    r = slotlab("report", str(GOLDEN / "session.jsonl"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert "the server's flags from the session log: -c 8192 -np 2 --cache-ram 256" in r.stderr
    key = lambda c: (c["request"], c["change"], c["processed"], c["stable_processed"], c["client"])  # noqa: E731
    assert [key(c) for c in rep["stable"]["calls"]] == [key(c) for c in doc["stable"]["calls"]]
    assert [t for t in rep["advice"]["flags"] if t["advice"]] == [t for t in doc["advice"]["flags"] if t["advice"]]
    bars = {c["request"]: c for conv in rep["conversations"] for c in conv["calls"]}
    clock = json.loads((GOLDEN / "truth.json").read_text())["calls"]
    for i, t in enumerate(clock):  # the clock's turns drawn as its client change, not as new tokens
        if t["conversation"] == "clock" and t["change"]:
            assert bars[i]["change"] == "system_changed"
            assert dict((p["cause"], p["tokens"]) for p in bars[i]["parts"]).get("client:system_changed", 0) > 2000
    t = slotlab("report", str(GOLDEN / "session.jsonl"))
    assert "a stable client: reused" in t.stdout and "untested" not in t.stdout
