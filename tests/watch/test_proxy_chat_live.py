"""`slotlab proxy --record` with agent-style chat traffic in front of the reference llama-server (skipped
with a message when it is not built): the official openai client (streamed and not, a tool round trip)
and Anthropic's `/v1/messages` (the anthropic SDK where it is installed, else its wire format over
httpx; streamed and not). The recording keeps every call (none dropped), each with its messages,
tools, the reply as generated and its arrival; written as a session log, `slotlab simulate --why`
reads it back with the right conversations and reports no client change for the plain turns."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from bench.build_llama_server import server_binary
from slotlab.llama.model import default_model_path
from slotlab.proxy import ProxyServer
from tests.golden.llama_server import LlamaServer

pytestmark = pytest.mark.slow
SYSTEM = "You are the assistant of a bicycle workshop. " + " ".join(f"Rule {i}: be brief about part {i}." for i in range(8))
TOOLS = [{"type": "function", "function": {"name": "stock_level", "description": "Units in stock of a part",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    if server_binary() is None:
        pytest.skip("the reference llama-server is not built (make llama-server)")
    with LlamaServer(default_model_path(), ["-np", "1", "-c", "8192", "--jinja"]) as srv:
        with ProxyServer(srv.url) as px:
            yield srv, px


def _openai_chat(px):
    from openai import OpenAI

    client = OpenAI(base_url=px.url + "/v1", api_key="none")
    m = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "My brakes squeal."}]
    kw = dict(model="gemma", max_tokens=6, temperature=0, extra_headers={"x-session-id": "openai-chat"})
    for q in ("Pads or rims?", "How long does it take?"):
        r = client.chat.completions.create(messages=m, **kw)
        m += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": q}]
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(messages=m, stream=True, **kw)
                   if c.choices)
    # a tool round trip in an agent's history (its tool call, the tool's result), then two turns that append
    t = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Pads in stock?"},
         {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "stock_level", "arguments": "{\"q\": \"pads\"}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "4 sets"}]
    r = client.chat.completions.create(model="gemma", messages=t, tools=TOOLS, max_tokens=6, temperature=0)
    t += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Order one."}]
    client.chat.completions.create(model="gemma", messages=t, tools=TOOLS, max_tokens=6, temperature=0)
    return text


def _anthropic(px):
    body = {"model": "gemma", "max_tokens": 6, "temperature": 0, "system": SYSTEM + " (anthropic)",
            "messages": [{"role": "user", "content": "My chain skips."}]}
    hdr = {"x-claude-code-session-id": "claude-1", "anthropic-version": "2023-06-01", "x-api-key": "none"}
    r = httpx.post(px.url + "/v1/messages", json=body, headers=hdr, timeout=120, trust_env=False).json()
    text = "".join(b.get("text", "") for b in r["content"])
    body["messages"] += [{"role": "assistant", "content": text}, {"role": "user", "content": "New chain?"}]
    with httpx.stream("POST", px.url + "/v1/messages", json={**body, "stream": True}, headers=hdr, timeout=120,
                      trust_env=False) as s:
        for _ in s.iter_lines():
            pass


def test_agent_traffic_is_recorded_and_read_back(proxied, tmp_path):
    srv, px = proxied
    _openai_chat(px)
    _anthropic(px)
    import time

    time.sleep(0.5)
    tr = px.recorder.trace()
    assert tr["recorder"]["skipped"] == [], tr["recorder"]["skipped"]
    reqs = tr["requests"]
    assert [r["endpoint"] for r in reqs] == ["/v1/chat/completions"] * 5 + ["/v1/messages"] * 2
    assert all("arrival" in r and r.get("reply") is not None and r["messages"] for r in reqs)
    assert reqs[3].get("tools") and any(m.get("tool_calls") for m in reqs[4]["messages"])
    assert reqs[1]["messages"][2] == {"role": "assistant", "content": reqs[0]["reply"]["content"]}
    assert [r.get("session_id") for r in reqs] == ["openai-chat"] * 3 + [None, None] + ["claude-1"] * 2
    log = tmp_path / "calls.jsonl"
    px.recorder.write(log)
    head, *lines = [json.loads(x) for x in log.read_text().splitlines()]
    # the header: the server's flags (-np and -c from /props: the proxy was given none) and build
    assert head["slotlab_session_log"] == 1 and head["flags"] == ["-np", "1", "-c", "8192"]
    assert head["server"]["build"].startswith("b11312")
    assert len(lines) == 7 and len({x["session_id"] for x in lines}) == 3  # the tool round trip joined up
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "simulate", str(log), "--why", "--json"],
                         capture_output=True, text=True, timeout=600)  # the flags: the log's header
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["results"]) == 7
    # plain turns (each echoes the reply as the server generated it) are no change
    assert doc["client_changes"] == [], doc["client_changes"]
