"""`slotlab proxy` on a scripted upstream (no model, seconds): what reaches the upstream is what the
client sent (but `Host`, hop-by-hop headers and the body framing), what reaches the client is what the
upstream answered byte for byte (status line, headers, chunk framing and trailers, a close-delimited
body, gzip left alone), a client that leaves mid-stream closes the upstream connection at once, and
the recorder turns the answers into trace requests and results."""

from __future__ import annotations

import gzip
import json
import socket
import time

import pytest

from slotlab.proxy import ProxyServer
from slotlab.proxy.record import Recorder
from tests.watch.fake_upstream import GZ, JSON_BODY, RESPONSES, SSE_EVENTS, FakeUpstream


@pytest.fixture()
def pair():
    with FakeUpstream() as up, ProxyServer(up.url, keep_answers=True) as px:
        yield up, px


def raw_exchange(port: int, request: bytes, *, expect_continue: bool = False) -> bytes:
    """Send `request` (with Connection: close) and read everything until the proxy closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        if expect_continue:
            head, body = request.split(b"\r\n\r\n", 1)
            s.sendall(head + b"\r\n\r\n")
            got = s.recv(100)
            assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
            s.sendall(body)
        else:
            s.sendall(request)
        out = b""
        while True:
            data = s.recv(65536)
            if not data:
                return out
            out += data


def post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def split(resp: bytes) -> tuple[bytes, list, bytes]:
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    return lines[0], [ln for ln in lines[1:] if not ln.lower().startswith(b"connection:")], body


def upstream_bytes(path: str) -> bytes:
    return b"".join(p for p in RESPONSES[path] if p is not None)


@pytest.mark.parametrize("path", ["/json", "/completion", "/close", "/denied", "/gzip", "/empty"])
def test_answers_pass_byte_for_byte(pair, path):
    up, px = pair
    got = raw_exchange(px.port, f"GET {path}?a=1&b=%20 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert split(got) == split(upstream_bytes(path))


def test_requests_pass_unchanged_but_host_and_framing(pair):
    up, px = pair
    body = json.dumps({"prompt": "é" * 3000, "n_predict": 1}).encode()
    req = (b"POST /json?x=1 HTTP/1.1\r\nHost: proxy.example\r\nAuthorization: Bearer sk-123\r\nX-Api-Key: k\r\n"
           b"Content-Type: application/json\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = raw_exchange(px.port, req, expect_continue=True)  # curl's way with a large body
    assert split(got) == split(upstream_bytes("/json"))
    seen = up.requests[-1]
    head, _, seen_body = seen.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /json?x=1 HTTP/1.1" and seen_body == body
    hs = {ln.split(b":", 1)[0].lower(): ln.split(b":", 1)[1].strip() for ln in lines[1:]}
    assert hs[b"host"] == f"127.0.0.1:{up.port}".encode()
    assert hs[b"authorization"] == b"Bearer sk-123" and hs[b"x-api-key"] == b"k"
    assert b"expect" not in hs and b"connection" not in hs and hs[b"content-length"] == str(len(body)).encode()


def test_keep_alive_and_chunked_request_bodies(pair):
    import http.client

    up, px = pair
    c = http.client.HTTPConnection("127.0.0.1", px.port, timeout=10)
    for _ in range(3):
        c.request("POST", "/json", body=b'{"prompt": "a"}', headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200 and r.read() == JSON_BODY
    c.request("POST", "/json", body=iter([b'{"prompt":', b' "b"}']), encode_chunked=True)  # a chunked upload
    r = c.getresponse()
    assert r.read() == JSON_BODY
    assert up.requests[-1].endswith(b'\r\n\r\n{"prompt": "b"}')
    c.close()
    assert up.connections <= 2  # the proxy keeps its upstream connection alive


def test_a_client_that_leaves_closes_the_upstream_connection(pair):
    up, px = pair
    s = socket.create_connection(("127.0.0.1", px.port), timeout=10)
    body = b'{"prompt": "x", "stream": true, "slow": true}'
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
              + body)
    got = b""
    while got.count(b"data:") < 3:
        got += s.recv(4096)
    t_close = time.monotonic()
    s.close()
    deadline = time.monotonic() + 3
    while up.slow_closed_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert up.slow_closed_at is not None, "the upstream never saw its client leave"
    assert up.slow_closed_at - t_close < 0.5
    time.sleep(0.1)
    assert px.app.n_disconnects == 1
    assert px.recorder.records[-1].cancelled


def test_an_upstream_that_does_not_answer_is_a_502():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, not listening: connections are refused
        with ProxyServer(f"http://127.0.0.1:{dead}") as px:
            got = raw_exchange(px.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, _, body = split(got)
    assert status == b"HTTP/1.1 502 Bad Gateway"
    assert json.loads(body)["error"]["type"] == "proxy_error"


def test_the_recorder_reads_streams_json_and_gzip(pair):
    up, px = pair
    raw_exchange(px.port, post("/completion", {"prompt": "Hello", "n_predict": 9, "stream": True, "seed": 3}))
    raw_exchange(px.port, post("/completion", {"prompt": [1, 2], "n_predict": 1}))  # token ids: not a trace request
    time.sleep(0.1)
    tr = px.recorder.trace()
    (r,) = tr["requests"]
    assert r.pop("arrival") >= 0 and r.pop("reply") == "Hello \u00e9\u00e8"  # always: when it came, what it got
    assert r == {"prompt": "Hello", "n_predict": 2, "seed": 3, "temperature": 0.8}
    final = SSE_EVENTS[-1]
    assert tr["results"] == [{"status": 200, "id_slot": 1, "cache_n": 3, "prompt_n": 4, "tokens_evaluated": 7,
                              "tokens_cached": 8, "content": "Hello \u00e9\u00e8", "error": None}]
    assert tr["recorded"][0]["stream"] and tr["recorded"][0]["n_predicted"] == final["tokens_predicted"]
    assert tr["recorder"]["skipped"][0]["reason"].startswith("the prompt is not one string")
    assert gzip.decompress(GZ) == JSON_BODY


def test_trace_requests_follow_arrival_and_overlap():
    from slotlab.proxy.app import RequestInfo

    rec = Recorder(["-np", "2"])
    body = lambda p: json.dumps({"prompt": p, "n_predict": 4, "temperature": 0}).encode()  # noqa: E731
    taps = [rec(RequestInfo(rec.t0 + t, "POST", "/completion", "", [], body(p))) for t, p in
            ((0.0, "a"), (0.1, "b"), (5.0, "c"))]
    for tap, done_at in zip(taps, (1.0, 2.0, 6.0)):  # a still runs when b arrives
        tap.body(JSON_BODY)
        tap.done(200, [(b"content-type", b"application/json")], False)
        tap.rec.t_done = done_at
    tr = rec.trace()
    assert [r.get("wait", True) for r in tr["requests"]] == [False, True, True]
    assert [r["n_predict"] for r in tr["requests"]] == [1, 1, 1]  # what the server generated
    assert [x["t"] for x in tr["recorded"]] == [0.0, 0.1, 5.0]
    from slotlab.engine.replay import parse_trace

    assert len(parse_trace(tr).requests) == 3  # slotlab replay reads it as it is


def test_the_chunk_scanner_follows_any_split():
    from slotlab.proxy.app import _ChunkScanner
    from tests.watch.fake_upstream import SSE_BODY

    raw = b"".join(RESPONSES["/completion"][1:])
    for k in (1, 2, 3, 5, 8, 13, 64, len(raw)):
        sc, payload, used = _ChunkScanner(), [], 0
        data = raw + b"GARBAGE"  # bytes after the last chunk are not the body's
        for i in range(0, len(data), k):
            if sc.done:
                break
            pieces, n = sc.feed(data[i:i + k])
            payload += pieces
            used += n
        assert sc.done and used == len(raw) and b"".join(payload) == SSE_BODY, k


def test_a_client_closing_after_the_last_event_is_not_a_cancel():
    from slotlab.proxy.app import RequestInfo
    from tests.watch.fake_upstream import SSE_BODY

    rec = Recorder()
    tap = rec(RequestInfo(rec.t0, "POST", "/completion", "", [], b'{"prompt": "p", "stream": true}'))
    tap.body(SSE_BODY)
    tap.done(200, [(b"content-type", b"text/event-stream")], True)  # closed before the terminating chunk
    assert not tap.rec.cancelled and tap.rec.result["cache_n"] == 3
    tap = rec(RequestInfo(rec.t0, "POST", "/completion", "", [], b'{"prompt": "p", "stream": true}'))
    tap.body(SSE_BODY[:40])
    tap.done(200, [(b"content-type", b"text/event-stream")], True)
    assert tap.rec.cancelled and tap.rec.result["error"]["code"] == 499


def test_slotlab_proxy_on_the_command_line(tmp_path):
    import subprocess
    import sys

    from slotlab.proxy import free_port

    port = free_port()
    trace = tmp_path / "trace.json"
    with FakeUpstream() as up:
        p = subprocess.Popen([sys.executable, "-m", "slotlab.cli", "proxy", "--upstream", up.url, "--port", str(port),
                              "--record", str(trace), "--flags", "-np 2 -c 4096"], stderr=subprocess.PIPE, text=True)
        try:
            assert "slotlab proxy: http://127.0.0.1:" in p.stderr.readline()
            got = raw_exchange(port, post("/completion", {"prompt": "Hi", "n_predict": 4, "temperature": 0}))
            assert split(got) == split(upstream_bytes("/completion"))
        finally:
            p.terminate()
            err = p.communicate(timeout=20)[1]
    assert p.returncode == 0 and "1 recorded" in err
    tr = json.loads(trace.read_text())
    assert tr["flags"] == ["-np", "2", "-c", "4096"]
    assert [{k: v for k, v in r.items() if k not in ("arrival", "reply")} for r in tr["requests"]] == [
        {"prompt": "Hi", "n_predict": 2, "temperature": 0}]
    assert all("arrival" in r for r in tr["requests"])


def test_sim_fields_for_slotlab_simulate(tmp_path):
    from slotlab.proxy.app import RequestInfo

    load_sim_trace = pytest.importorskip("slotlab.sim.traces").load_sim_trace
    rec = Recorder(["-np", "1"], sim_fields=True)
    for t, toks in ((0.5, [5, 6]), (2.0, None)):
        tap = rec(RequestInfo(rec.t0 + t, "POST", "/completion", "", [], b'{"prompt": "p", "return_tokens": true}'))
        answer = {"content": "ab", "tokens": toks or [], "tokens_predicted": 2, "timings": {"cache_n": 0, "prompt_n": 3}}
        tap.body(json.dumps(answer).encode())
        tap.done(200, [(b"content-type", b"application/json")], False)
    path = tmp_path / "t.json"
    rec.write(path)
    sim = load_sim_trace(path)
    assert [r.arrival for r in sim.requests] == [0.5, 2.0]
    assert list(sim.requests[0].output) == [5, 6] and sim.requests[1].output is None


def _chat_record(rec, path: str, body: dict, answer, headers=(), stream: bool = False):
    from slotlab.proxy.app import RequestInfo

    tap = rec(RequestInfo(rec.t0 + 1.0, "POST", path, "", list(headers), json.dumps(body).encode()))
    if stream:
        data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in answer)
        tap.body(data)
        tap.done(200, [(b"content-type", b"text/event-stream")], False)
    else:
        tap.body(json.dumps(answer).encode())
        tap.done(200, [(b"content-type", b"application/json")], False)
    return rec.records[-1]


def test_chat_calls_keep_messages_tools_reply_and_session():
    """The three chat APIs: the reply as generated (whole or streamed, tool calls included), the tools,
    the conversation id from a session header; a POST that is not a call is listed, not dropped."""
    from slotlab.proxy.app import RequestInfo

    rec = Recorder(["-np", "1"])
    tools = [{"type": "function", "function": {"name": "stock_level", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "pads in stock?"}]
    r1 = _chat_record(rec, "/v1/chat/completions", {"messages": msgs, "tools": tools}, {
        "choices": [{"message": {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "stock_level", "arguments": "{\"q\": \"pads\"}"}}]}}],
        "usage": {"completion_tokens": 7, "prompt_tokens": 20}, "timings": {"cache_n": 0, "prompt_n": 20}},
        headers=[(b"X-Session-Id", b"agent-1")])
    assert r1.session == "agent-1" and rec.chat_body(r1) == {"messages": msgs, "tools": tools}
    assert r1.reply["tool_calls"][0]["function"] == {"name": "stock_level", "arguments": "{\"q\": \"pads\"}"}
    r2 = _chat_record(rec, "/v1/chat/completions", {"messages": msgs, "stream": True}, [
        {"choices": [{"delta": {"reasoning_content": "think"}}]}, {"choices": [{"delta": {"content": "Yes, "}}]},
        {"choices": [{"delta": {"content": "4 sets."}, "finish_reason": "stop"}], "timings": {"cache_n": 5}}],
        stream=True)
    assert r2.reply == {"role": "assistant", "content": "Yes, 4 sets.", "reasoning_content": "think"}
    r3 = _chat_record(rec, "/v1/messages", {"model": "m", "max_tokens": 8, "messages": msgs,
                                             "metadata": {"user_id": "claude-7"}}, {
        "type": "message", "content": [{"type": "text", "text": "Four."}, {"type": "tool_use", "id": "t1",
                                                                          "name": "order_part", "input": {"q": "pads"}}],
        "usage": {"input_tokens": 3, "output_tokens": 5, "cache_read_input_tokens": 17}})
    # a plain Anthropic user id names the user (who runs several conversations), not a conversation
    assert r3.session is None and r3.user == "claude-7" and r3.reply["content"] == "Four."
    assert r3.reply["tool_calls"][0]["function"]["name"] == "order_part" and r3.n_predicted == 5
    assert r3.result["cache_n"] == 17 and r3.result["tokens_evaluated"] == 20
    r4 = _chat_record(rec, "/v1/messages", {"model": "m", "max_tokens": 8, "messages": msgs, "stream": True}, [
        {"type": "message_start", "message": {"usage": {"input_tokens": 3}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Fo"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ur."}},
        {"type": "message_delta", "usage": {"output_tokens": 2}}, {"type": "message_stop"}], stream=True)
    assert r4.reply["content"] == "Four." and not r4.cancelled
    # Claude Code's user id carries its session: that part names the conversation
    r4b = _chat_record(rec, "/v1/messages", {"model": "m", "max_tokens": 8, "messages": msgs, "metadata": {
        "user_id": "user_4f1c_account_77aa_session_0b5e2d9a-3c1f"}}, {
        "type": "message", "content": [{"type": "text", "text": "Ok."}], "usage": {"input_tokens": 3, "output_tokens": 1}})
    assert r4b.session == "0b5e2d9a-3c1f" and r4b.user is None
    r5 = _chat_record(rec, "/v1/responses", {"input": "pads in stock?"}, {
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "Yes."}]}],
        "usage": {"input_tokens": 9, "output_tokens": 2}})
    assert r5.reply["content"] == "Yes." and rec.chat_body(r5)["messages"][-1]["content"] == "pads in stock?"
    rec(RequestInfo(rec.t0 + 2, "POST", "/v1/messages/count_tokens", "", [], b"{}"))
    tr = rec.trace()  # no upstream: the chat prompts cannot be rendered, and each says so
    assert [s["reason"] for s in tr["recorder"]["skipped"]] == ["a chat request, and no upstream to apply its "
                                                                "template"] * 6
    assert tr["recorder"]["not_calls"] == [{"t": 2.0, "endpoint": "/v1/messages/count_tokens",
                                            "reason": "counting tokens runs no completion"}]


def test_the_session_log_header_fills_in_what_props_tells():
    """`--flags` without -np / -c: the header takes them from /props (a slot's context times the slots,
    unless the KV is unified), and says so; flags that disagree with /props are noted, not changed."""
    rec = Recorder(["--cache-ram", "256"], upstream="http://127.0.0.1:9")
    rec._props = {"build": "b11312-abc", "total_slots": 2, "n_ctx": 4096}
    h = rec.header()
    assert h["flags"] == ["--cache-ram", "256", "-np", "2", "-c", "8192"] and h["server"]["build"] == "b11312-abc"
    assert any("-c 8192 from the server's /props (2 slots of 4096 tokens" in n for n in h["notes"])
    rec = Recorder(["-np", "3", "-c", "8192", "-kvu"], upstream="http://127.0.0.1:9")
    rec._props = {"total_slots": 2, "n_ctx": 8192}
    h = rec.header()
    assert h["flags"] == ["-np", "3", "-c", "8192", "-kvu"] and h["notes"] == ["--flags say -np 3, the server's /props 2 slots"]
    rec = Recorder([], upstream="http://127.0.0.1:9")  # nothing answers there: the reason is kept
    h = rec.header()
    assert h["flags"] == [] and "no --flags given" in h["notes"][0] and "/props" in rec.problems[0]
