"""The agent session (tests/agent/scenario.py) driven now, through `slotlab proxy --record` with the
real openai and anthropic SDKs, in front of the reference llama-server where it is built and in front
of `slotlab serve` always; the recording is analysed by `slotlab simulate --why` alone and checked
against what the driver did (tests/agent/check.py)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.build_llama_server import server_binary
from tests.agent.check import analyse, check, confirm_advice, tools_render
from tests.agent.record_agent_session import record

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["slotlab", "llama-server"])
def test_a_live_agent_session_through_the_proxy(kind, tmp_path):
    if kind == "llama-server" and server_binary() is None:
        pytest.skip("the reference llama-server is not built (make llama-server): only slotlab serve is proxied")
    sent = record(tmp_path, serve=kind == "slotlab")
    doc, text, err = analyse(tmp_path / "session.jsonl")
    cost = check(doc, text, err, [dataclasses.asdict(s) for s in sent],
                 tools_visible=tools_render(tmp_path / "session.jsonl"))
    assert cost["system_changed"] > 5000
    confirm_advice(tmp_path / "session.jsonl", doc)
