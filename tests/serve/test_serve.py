"""`slotlab serve` with real clients: the official openai client, streaming, cancellations under load,
the API key, metrics and the server's error texts."""

import json
import random
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer, slotlab_serve_command
from tests.golden.record_openai_chat import FLAGS, run_chat

KEY = "test-key"
GOLDEN = Path(__file__).parents[1] / "golden"


def test_openai_chat_cached_tokens_grow_as_with_the_real_server():
    want = json.loads((GOLDEN / "openai_chat.llama-server.json").read_text())
    with LlamaServer(default_model_path(), FLAGS, command=slotlab_serve_command()) as srv:
        got = run_chat(srv.url + "/v1")
    assert got == want["turns"]
    cached = [t["cached_tokens"] for t in got]
    assert cached[0] == 0 and cached == sorted(cached) and cached[-1] > 500


@pytest.fixture(scope="module")
def srv():
    d = tempfile.mkdtemp()
    with LlamaServer(default_model_path(), ["-np", "4", "-kvu", "-c", "4096", "--swa-full", "--metrics",
                                            "--api-key", KEY, "--slot-save-path", d],
                     command=slotlab_serve_command()) as s:
        yield s


def _c(srv):
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def test_api_key_and_public_health(srv):
    assert httpx.get(srv.url + "/health").status_code == 200
    r = httpx.get(srv.url + "/slots")
    assert r.status_code == 401 and r.json()["error"] == {"code": 401, "message": "Invalid API Key",
                                                          "type": "authentication_error"}
    assert httpx.get(srv.url + "/slots", headers={"X-Api-Key": KEY}).status_code == 200


def test_errors_follow_the_server(srv):
    c = _c(srv)
    r = c.post("/completion", json={"prompt": "x " * 5000, "n_predict": 2})
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    r = c.post("/completion", json={"prompt": "hi", "lora": [{"id": 0, "scale": 1.0}]})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    r = c.post("/slots/0?action=save", json={"filename": "../x"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid filename"
    assert c.post("/slots/abc?action=erase").json()["error"]["message"] == "Invalid slot ID"
    assert c.post("/slots/0?action=nope").json()["error"]["message"] == "Invalid action"
    r = c.post("/detokenize", json={"tokens": [1, 10**9]})  # the server's vector::at error, a 500 (golden_bad_input)
    assert r.status_code == 500 and r.json()["error"]["message"].startswith("vector::_M_range_check: __n (which is 1000000000)")


def test_tokenize_props_and_slots(srv):
    c = _c(srv)
    toks = c.post("/tokenize", json={"content": "Hello world", "add_special": True}).json()["tokens"]
    assert toks[0] == 2 and c.post("/detokenize", json={"tokens": toks}).json()["content"] == "<bos>Hello world"
    pieces = c.post("/tokenize", json={"content": "Hello", "with_pieces": True}).json()["tokens"]
    assert pieces[0]["piece"] == "Hello"
    props = c.get("/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 4096
    assert len(c.get("/slots").json()) == 4


def test_streaming_completion_matches_the_non_streaming_one(srv):
    c = _c(srv)
    body = {"prompt": "The three primary colours are", "n_predict": 12, "temperature": 0, "ignore_eos": True}
    plain = c.post("/completion", json=body).json()
    text, final = "", None
    with c.stream("POST", "/completion", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                ev = json.loads(line[6:])
                if ev.get("stop"):
                    final = ev
                else:
                    text += ev["content"]
    assert text == plain["content"] and final["tokens_predicted"] == 12


def test_load_with_streaming_and_cancellations(srv):
    """200 requests from 16 concurrent clients; a third are streamed and dropped mid-stream."""
    rng = random.Random(0)
    errors, done, cancelled = [], [0], [0]
    lock = threading.Lock()
    prompts = [f"Customer {i % 7} asks about order {i}: where is my parcel?" for i in range(200)]

    def client(jobs):
        with _c(srv) as c:
            for i in jobs:
                body = {"prompt": prompts[i], "n_predict": rng.choice([2, 6, 24]), "temperature": 0, "ignore_eos": True}
                try:
                    if i % 3 == 0:
                        with c.stream("POST", "/completion", json={**body, "n_predict": 48, "stream": True}) as r:
                            for k, line in enumerate(r.iter_lines()):
                                if k >= 2:
                                    break  # drop the connection mid-stream
                        with lock:
                            cancelled[0] += 1
                    else:
                        r = c.post("/completion", json=body)
                        assert r.status_code == 200, r.text
                        assert r.json()["tokens_predicted"] == body["n_predict"]
                        with lock:
                            done[0] += 1
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))

    jobs = [list(range(k, 200, 16)) for k in range(16)]
    threads = [threading.Thread(target=client, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors[:3]
    assert done[0] + cancelled[0] == 200
    c = _c(srv)
    deadline = time.time() + 60
    while time.time() < deadline and any(s["is_processing"] for s in c.get("/slots").json()):
        time.sleep(0.2)
    assert not any(s["is_processing"] for s in c.get("/slots").json())  # every slot idle again
    m = {line.split()[0]: float(line.split()[1]) for line in c.get("/metrics").text.splitlines() if not line.startswith("#")}
    assert m["llamacpp:requests_deferred"] == 0 and m["llamacpp:requests_processing"] == 0
    assert m["llamacpp:tokens_predicted_total"] >= done[0] * 2
