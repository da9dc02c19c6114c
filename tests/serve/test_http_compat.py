"""Pieces of `slotlab serve`'s HTTP contract that need no model: the streamed text as the server sends
it (process_token's text_to_send), the Anthropic request conversion, the GCP route aliases and the
header case."""

from __future__ import annotations

from slotlab.serve import anthropic as A
from slotlab.serve.cors import canonical_name
from slotlab.serve.gcp import GcpParams, path_to_gcp_format
from slotlab.serve.stream import TextSender, find_partial_stop, validate_utf8


class _Vocab:
    """Token id -> bytes; 0 is the end-of-generation token."""
    PIECES = {1: b"Hel", 2: b"lo", 3: b" wor", 4: b"ld!", 5: b"\xe2\x82", 6: b"\xac", 7: b"\n"}

    def is_eog(self, t):
        return t == 0

    def token_to_piece(self, t, special=True):
        return self.PIECES[t]


def test_utf8_and_partial_stop_helpers():
    assert validate_utf8(b"ab\xe2\x82") == 2 and validate_utf8(b"ab\xe2\x82\xac") == 5 and validate_utf8(b"") == 0
    assert find_partial_stop(b"hello wor", b"world") == 6
    assert find_partial_stop(b"abc", b"x") == -1


def test_a_stop_string_is_held_back_then_cut():
    s = TextSender(_Vocab(), ["world"])
    assert [s.push(t) for t in (1, 2, 3, 4)] == ["Hel", "lo", "", " "]  # " wor" may start "world"
    assert s.content == "Hello " and s.stopping_word == "world"


def test_an_unfinished_character_sends_nothing_and_eog_adds_no_text():
    s = TextSender(_Vocab(), [])
    assert [s.push(t) for t in (1, 5, 6, 7, 0)] == ["Hel", None, "€", "\n", ""]
    assert s.content == "Hel€\n" and s.has_new_line and s.stopping_word == ""


def test_replay_is_the_final_content():
    s = TextSender.replay(_Vocab(), [1, 2, 3, 4, 0], ["ld"])
    assert s.content == "Hello wor" and s.stopping_word == "ld"


def test_anthropic_request_as_openai_chat():
    body = {"model": "m", "system": [{"type": "text", "text": "Be brief."}], "max_tokens": 9, "top_k": 3,
            "stop_sequences": ["END"], "metadata": {"user_id": "u1"},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it"},
                                                  {"type": "tool_use", "id": "t1", "name": "w",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "text", "text": "sunny"}]},
                                             {"type": "text", "text": "thanks"}]}],
            "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"}}
    oai = A.to_oai(body)
    assert oai["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "call it",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}}]},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"}]
    assert oai["tools"] == [{"type": "function", "function": {"name": "w", "description": "weather",
                                                              "parameters": {"type": "object"}}}]
    assert (oai["tool_choice"], oai["stop"], oai["max_tokens"], oai["top_k"], oai["__metadata_user_id"]) == \
        ("required", ["END"], 9, 3, "u1")
    assert A.to_oai({"messages": []})["max_tokens"] == 4096
    assert A._billing("x-anthropic-billing-header: a=1; cch=a5145;You are") == \
        "x-anthropic-billing-header: a=1; cch=fffff;You are"


def test_anthropic_answer_and_events():
    r = {"stop_type": "eos", "tokens_evaluated": 20, "tokens_predicted": 3, "timings": {"cache_n": 5}}
    js = A.final_json("id1", "m", r, "hi", "")
    assert js["content"] == [{"type": "text", "text": "hi"}] and js["stop_reason"] == "end_turn"
    assert js["usage"] == {"cache_read_input_tokens": 5, "input_tokens": 15, "output_tokens": 3}
    ev = A.final_events(r, True, "")
    assert [e["event"] for e in ev] == ["content_block_stop", "message_delta", "message_stop"]
    assert A.sse(ev[-1:]) == b'event: message_stop\ndata: {"type": "message_stop"}\n\n'


def test_gcp_aliases_and_params():
    assert path_to_gcp_format("/v1/chat/completions") == "chatCompletions"
    assert path_to_gcp_format("/apply-template") == "applyTemplate"
    g = GcpParams({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "run", "AIP_HTTP_PORT": "9000"})
    assert (g.enabled, g.path_predict, g.port, g.path_health) == (True, "/run", 9000, "")
    assert not GcpParams({}).enabled


def test_header_names_in_the_servers_case():
    assert canonical_name(b"process-start-time-unix") == b"Process-Start-Time-Unix"
    assert canonical_name(b"content-type") == b"Content-Type"


def test_sleep_clears_the_slots_and_the_cache_and_wakes():
    """--sleep-idle-seconds: after the idle time every slot and the RAM cache are empty (the server
    frees its context and re-creates slots and cache on waking); waking is a flag, the caches stay
    cold until requests fill them."""
    import time

    from slotlab.engine.scheduler import Engine
    from slotlab.memory.fake import FakeMemory
    from slotlab.serve.sleep import Sleep

    e = Engine("-np 2 --cache-ram 100 --sleep-idle-seconds 0", memory=FakeMemory(n_slots=2))
    t = e.submit("You are a helpful assistant. " * 4, n_predict=2)
    e.run_until(lambda: t.done)
    assert t.error is None and any(len(s.tokens) for s in e.core.slots)
    s = Sleep(e, e.params.sleep_idle_seconds)
    s._maybe_sleep()
    assert s.sleeping and s.snapshot is not None
    assert all(len(x.tokens) == 0 and x.task_prev is None for x in e.core.slots)
    assert e.core.cache is None or e.core.cache.n_tokens() == 0
    assert [ev.payload.reason for ev in e.events.log if ev.kind == "slot_clear"][-1] == "sleep"
    s.wake()
    assert not s.sleeping and time.monotonic() - s.t_last < 5
    assert not Sleep(e, -1).enabled
