"""`slotlab proxy` in front of a real server (`slotlab serve` always; the reference llama-server when it
is built, else skipped with a message), with the server's --api-key:

* traffic from curl (streamed and not) and the official openai client (completions and chat, streamed
  and not) reaches the client byte for byte as the server sent it (the client's raw bytes equal the
  answer bytes the proxy read from the server), the API key passes through (without it: the server's
  401, untouched);
* one streamed request cancelled mid-stream: the server sees its client leave (its slot is released
  long before its n_predict);
* the recorded trace, replayed in slotlab (`slotlab.engine.replay`), gives every completed request the
  slot, cache_n, prompt_n, tokens_evaluated and tokens_cached the server answered (where the answer has
  them: the OpenAI shapes carry no slot)."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from bench.build_llama_server import server_binary
from slotlab.engine.replay import load_trace, replay
from slotlab.llama.model import default_model_path
from slotlab.proxy import ProxyServer
from tests.golden.llama_server import LlamaServer, slotlab_serve_command
from tests.watch.scenario import A, B, C, FLAGS

pytestmark = pytest.mark.slow
KEY = "proxy-test-key"
KEYS = ("id_slot", "cache_n", "prompt_n", "tokens_evaluated", "tokens_cached")


class TeeTransport(httpx.HTTPTransport):
    """An httpx transport that keeps the raw bytes of every answer it hands to the client."""

    def __init__(self, sink: list):
        super().__init__()
        self.sink = sink

    def handle_request(self, request):
        resp = super().handle_request(request)
        buf = bytearray()
        self.sink.append(buf)
        inner = resp.stream

        class Tee(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in inner:
                    buf.extend(chunk)
                    yield chunk

            def close(self):
                inner.close()

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Tee(), extensions=resp.extensions)


def curl(url: str, body: dict, key: str | None = KEY) -> bytes:
    cmd = ["curl", "-sS", "-N", "--max-time", "600", url, "-H", "Content-Type: application/json", "-d", json.dumps(body)]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    return subprocess.run(cmd, capture_output=True, check=True, timeout=620).stdout


@pytest.mark.parametrize("kind", ["slotlab", "llama-server"])
def test_proxy_passes_traffic_and_records_a_replayable_trace(kind, tmp_path):
    if kind == "llama-server" and server_binary() is None:
        pytest.skip("the reference llama-server is not built (run `make llama-server`): only slotlab serve is proxied")
    from openai import OpenAI

    command = slotlab_serve_command() if kind == "slotlab" else None
    got: list = []  # what each client received, in order
    trace_path = tmp_path / "trace.json"
    with LlamaServer(default_model_path(), [*FLAGS, "--api-key", KEY], command=command) as srv, \
            ProxyServer(srv.url, record=trace_path, flags=FLAGS, keep_answers=True) as px:
        greedy = {"temperature": 0, "ignore_eos": True}
        got.append(curl(px.url + "/completion", {"prompt": A, "n_predict": 4, **greedy}))
        got.append(curl(px.url + "/completion", {"prompt": A + " More?", "n_predict": 3, "stream": True, **greedy}))
        raw: list = []
        oai = OpenAI(base_url=px.url + "/v1", api_key=KEY, http_client=httpx.Client(transport=TeeTransport(raw),
                                                                                   timeout=600))
        r = oai.completions.create(model="m", prompt=B, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
        msgs = [{"role": "system", "content": C}, {"role": "user", "content": "Which shelf holds item 15?"}]
        stream = oai.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        msgs += [{"role": "assistant", "content": "Shelf 1."}, {"role": "user", "content": "And item 16?"}]
        r = oai.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert r.usage.prompt_tokens_details.cached_tokens > 0  # the chat prefix was reused
        got += raw
        denied = curl(px.url + "/completion", {"prompt": "x", "n_predict": 1}, key=None)
        assert json.loads(denied)["error"]["code"] == 401
        got.append(denied)

        # a streamed request cancelled after a few events
        n_before = len(px.recorder.records)
        with httpx.Client(timeout=600) as c:
            with c.stream("POST", px.url + "/completion", headers={"Authorization": f"Bearer {KEY}"},
                          json={"prompt": B + " Go on.", "n_predict": 400, "stream": True, **greedy}) as resp:
                seen = b""
                for chunk in resp.iter_raw():
                    seen += chunk
                    if seen.count(b"data:") >= 3:
                        break
        t_cancel = time.monotonic()
        slot = None
        while time.monotonic() - t_cancel < 60:
            slots = httpx.get(srv.url + "/slots", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
            slot = slots[0]
            if not slot["is_processing"]:
                break
            time.sleep(0.05)
        assert not slot["is_processing"], "the server did not see its client leave"
        assert slot["next_token"][0]["n_decoded"] < 400
        rec = px.recorder.records[n_before]
        assert rec.done.wait(10) and rec.cancelled
        assert bytes(rec.answer).startswith(seen)
        records = px.recorder.records[:n_before]
        assert all(r.done.wait(10) for r in records)
        # byte for byte: what each client got is what the proxy read from the server
        assert len(records) == len(got)
        for i, (r, g) in enumerate(zip(records, got)):
            assert bytes(r.answer) == g, f"{kind}: request {i} ({r.path}) changed on its way"
    assert px.app.n_disconnects >= 1 and not px.app.tap_errors

    trace = json.loads(trace_path.read_text())
    assert trace["flags"] == FLAGS and len(trace["requests"]) == 6  # the 401 is not a trace request
    assert [x["endpoint"] for x in trace["recorded"]] == ["/completion", "/completion", "/v1/completions",
                                                          "/v1/chat/completions", "/v1/chat/completions", "/completion"]
    assert trace["recorded"][-1]["cancelled"] and trace["recorder"]["skipped"][0]["reason"].startswith("rejected")
    out = replay(load_trace(trace_path))
    out["engine"].close()
    for i, (want, mine) in enumerate(zip(trace["results"][:-1], out["results"][:-1])):  # the cancelled one aside
        assert want["status"] == 200 and mine["status"] == 200, (i, want, trace["recorded"][i], mine)
        for k in KEYS:
            if want[k] is not None:
                assert mine[k] == want[k], f"{kind}: request {i} ({trace['recorded'][i]['endpoint']}): {k} " \
                                           f"server {want[k]}, slotlab replay {mine[k]}"
    assert trace["results"][0]["id_slot"] == 0 and trace["results"][1]["cache_n"] > 0
