"""Anthropic's Messages API over the chat path, as llama-server has it: `POST /v1/messages` and
`/v1/messages/count_tokens` convert the request to an OpenAI chat request
(server-chat.cpp server_chat_convert_anthropic_to_oai), run it as `/v1/chat/completions` does, and
shape the answer as Anthropic's (server-task.cpp to_json_anthropic, to_json_anthropic_stream and the
partial's to_json_anthropic): a `message` with content blocks and `usage` (`cache_read_input_tokens`
= the prompt tokens the slot reused), or the `message_start` / `content_block_*` / `message_delta` /
`message_stop` events."""

from __future__ import annotations

import json

from slotlab.serve import nljson as J


def _billing(system_text: str) -> str:
    """normalize_anthropic_billing_header: the per-request `cch=` hash is blanked, so the system prompt
    (and the cache) stays the same across requests."""
    prefix = "x-anthropic-billing-header:"
    if not system_text.startswith(prefix):
        return system_text
    i = system_text.find("cch=", len(prefix))
    if i == -1:
        return system_text
    j = i + 4
    if j + 5 < len(system_text) and system_text[j + 5] == ";":
        return system_text[:j] + "fffff" + system_text[j + 5:]
    return system_text


def _str(obj, key: str, default: str = "") -> str:
    return J.json_value(obj, key, default, J.get_str) if isinstance(obj, dict) else default


def _image_url(source) -> str | None:
    source = source if isinstance(source, dict) else {}
    kind = _str(source, "type")
    if kind == "base64":
        return f"data:{_str(source, 'media_type', 'image/jpeg')};base64,{_str(source, 'data')}"
    if kind == "url":
        return _str(source, "url")
    return None


def to_oai(body: dict) -> dict:
    """server_chat_convert_anthropic_to_oai."""
    messages = []
    system = body.get("system")
    if system is not None:
        text = ""
        if isinstance(system, str):
            text = _billing(system)
        elif isinstance(system, list):
            for block in system:
                if _str(block, "type") == "text":
                    text += _billing(_str(block, "text"))
        messages.append({"role": "system", "content": text})
    if "messages" not in body:
        raise RuntimeError("'messages' is required")
    msgs = body["messages"]
    for msg in msgs if isinstance(msgs, list) else []:
        role = _str(msg, "role")
        if not isinstance(msg, dict) or "content" not in msg:
            if role == "assistant":
                continue
            messages.append(msg)
            continue
        content = msg["content"]
        if not isinstance(content, list):
            messages.append(msg)
            continue
        tool_calls, converted, tool_results, reasoning = [], [], [], ""
        for block in content:
            kind = _str(block, "type")
            if kind == "text":
                converted.append(block)
            elif kind == "thinking":
                reasoning += _str(block, "thinking")
            elif kind == "image":
                url = _image_url(block.get("source"))
                if url is not None:
                    converted.append({"type": "image_url", "image_url": {"url": url}})
            elif kind == "tool_use":
                inp = block.get("input", {})
                tool_calls.append({"id": _str(block, "id"), "type": "function",
                                   "function": {"name": _str(block, "name"),
                                                "arguments": json.dumps({} if inp is None else inp,
                                                                        ensure_ascii=False, separators=(",", ":"))}})
            elif kind == "tool_result":
                tid = _str(block, "tool_use_id")
                rc = block.get("content")
                if isinstance(rc, str):
                    tool_results.append({"role": "tool", "tool_call_id": tid, "content": rc})
                elif isinstance(rc, list):
                    text, parts, images = "", [], False
                    for c in rc:
                        ck = _str(c, "type")
                        if ck == "text":
                            t = _str(c, "text")
                            text += t
                            parts.append({"type": "text", "text": t})
                        elif ck == "image":
                            images = True
                            url = _image_url(c.get("source"))
                            if url is not None:
                                parts.append({"type": "image_url", "image_url": {"url": url}})
                    tool_results.append({"role": "tool", "tool_call_id": tid, "content": parts if images else text})
                else:
                    tool_results.append({"role": "tool", "tool_call_id": tid, "content": ""})
        if converted or tool_calls or reasoning:
            new = {"role": role}
            if converted:
                new["content"] = converted
            else:
                new["content"] = ""
            if tool_calls:
                new["tool_calls"] = tool_calls
            if reasoning:
                new["reasoning_content"] = reasoning
            messages.append(new)
        messages.extend(tool_results)
    out: dict = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [{"type": "function", "function": {
            "name": _str(t, "name"), "description": _str(t, "description"),
            "parameters": t["input_schema"] if isinstance(t, dict) and "input_schema" in t else {}}} for t in tools]
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = _str(tc, "type")
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind in ("any", "tool"):
            out["tool_choice"] = "required"
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    out["max_tokens"] = body["max_tokens"] if "max_tokens" in body else 4096
    for key in ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs"):
        if key in body:
            out[key] = body[key]
    if "thinking" in body:
        th = body.get("thinking")
        th = th if isinstance(th, dict) else {}
        if _str(th, "type") == "enabled":
            out["thinking_budget_tokens"] = J.json_value(th, "budget_tokens", 10000, J.get_int)
    if "metadata" in body:
        md = body.get("metadata")
        user = _str(md if isinstance(md, dict) else {}, "user_id")
        if user:
            out["__metadata_user_id"] = user
    return out


def stop_reason(r: dict) -> str:
    return "end_turn" if r["stop_type"] in ("word", "eos") else "max_tokens"


def usage(r: dict) -> dict:
    cached = r["timings"]["cache_n"]
    return {"cache_read_input_tokens": cached, "input_tokens": r["tokens_evaluated"] - cached,
            "output_tokens": r["tokens_predicted"]}


def final_json(cid: str, model: str, r: dict, content: str, stopping_word: str) -> dict:
    """to_json_anthropic (no tool calls, no reasoning: slotlab's chat answers are content)."""
    blocks = [{"type": "text", "text": content}] if content else []
    return {"id": cid, "type": "message", "role": "assistant", "content": blocks, "model": model,
            "stop_reason": stop_reason(r), "stop_sequence": stopping_word or None, "usage": usage(r)}


def message_start(cid: str, model: str, n_prompt: int, n_cached: int) -> dict:
    return {"event": "message_start", "data": {"type": "message_start", "message": {
        "id": cid, "type": "message", "role": "assistant", "content": [], "model": model, "stop_reason": None,
        "stop_sequence": None, "usage": {"cache_read_input_tokens": n_cached, "input_tokens": n_prompt - n_cached,
                                         "output_tokens": 0}}}}


def text_events(text: str, started: bool) -> list[dict]:
    """A content diff: the text block opens (index 0) with its first text, then text_delta."""
    out = []
    if not started:
        out.append({"event": "content_block_start", "data": {"type": "content_block_start", "index": 0,
                                                              "content_block": {"type": "text", "text": ""}}})
    out.append({"event": "content_block_delta", "data": {"type": "content_block_delta", "index": 0,
                                                          "delta": {"type": "text_delta", "text": text}}})
    return out


def final_events(r: dict, has_text: bool, stopping_word: str) -> list[dict]:
    """to_json_anthropic_stream with no diffs left: close the text block, message_delta, message_stop."""
    out = []
    if has_text:
        out.append({"event": "content_block_stop", "data": {"type": "content_block_stop", "index": 0}})
    out.append({"event": "message_delta", "data": {"type": "message_delta",
                                                   "delta": {"stop_reason": stop_reason(r),
                                                             "stop_sequence": stopping_word or None},
                                                   "usage": {"output_tokens": r["tokens_predicted"]}}})
    out.append({"event": "message_stop", "data": {"type": "message_stop"}})
    return out


def sse(events: list[dict]) -> bytes:
    """format_anthropic_sse."""
    out = []
    for e in events:
        if "event" in e and "data" in e:
            out.append(f"event: {e['event']}\ndata: {json.dumps(e['data'], ensure_ascii=False)}\n\n")
        else:
            out.append(f"data: {json.dumps(e, ensure_ascii=False)}\n\n")
    return "".join(out).encode()
