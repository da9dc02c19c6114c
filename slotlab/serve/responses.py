"""OpenAI's Responses API request as a chat request, as llama-server converts it
(server-chat.cpp server_chat_convert_responses_to_chatcmpl): `input` (a string, or input items:
messages, function calls and their outputs, reasoning) and `instructions` become `messages`,
`max_output_tokens` becomes `max_tokens`, function tools become chat tools. Its errors are the
server's invalid_argument texts (400)."""

from __future__ import annotations

import copy
import logging

log = logging.getLogger("slotlab.serve")


class ResponsesError(ValueError):
    """The conversion's std::invalid_argument: 400 invalid_request_error."""


def _is_str(j, key):
    return isinstance(j, dict) and isinstance(j.get(key), str)


def _is_arr(j, key):
    return isinstance(j, dict) and isinstance(j.get(key), list)


def to_chat(body: dict) -> dict:
    if "input" not in body:
        raise ResponsesError("'input' is required")
    prev = body.get("previous_response_id")
    if isinstance(prev, str) and prev:
        raise ResponsesError("llama.cpp does not support 'previous_response_id'.")
    inp = body["input"]
    out = {k: v for k, v in body.items() if k != "input"}
    msgs: list[dict] = []
    if "instructions" in body:
        ins = body.get("instructions")
        msgs.append({"role": "system", "content": ins if isinstance(ins, str) else ""})
        out.pop("instructions", None)
    if isinstance(inp, str):
        msgs.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for item in inp:
            item = copy.deepcopy(item) if isinstance(item, dict) else item
            merge_prev = bool(msgs) and msgs[-1].get("role", "") == "assistant"
            if _is_str(item, "content"):
                item["content"] = [{"text": item["content"], "type": "input_text"}]
            if _is_arr(item, "content") and _is_str(item, "role") and item["role"] in ("user", "system", "developer"):
                content = []
                for part in item["content"]:
                    kind = part.get("type", "") if isinstance(part, dict) else ""
                    if kind == "input_text":
                        if "text" not in part:
                            raise ResponsesError("'Input text' requires 'text'")
                        content.append({"text": part["text"], "type": "text"})
                    elif kind == "input_image":
                        if "image_url" not in part:
                            raise ResponsesError("'image_url' is required")
                        content.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
                    elif kind == "input_file":
                        raise ResponsesError("'input_file' is not supported by llamacpp at this moment")
                    else:
                        raise ResponsesError("'type' must be one of 'input_text', 'input_image', or 'input_file'")
                item.pop("type", None)
                item.pop("status", None)
                item["content"] = content
                msgs.append(item)
            elif _is_str(item, "role") and item["role"] == "assistant" and _is_str(item, "type") \
                    and item["type"] == "message":
                content = []
                if isinstance(item.get("content"), str):
                    content.append({"text": item["content"], "type": "text"})
                elif _is_arr(item, "content"):
                    for part in item["content"]:
                        kind = part.get("type", "") if isinstance(part, dict) else ""
                        if kind in ("output_text", "input_text"):
                            if not _is_str(part, "text"):
                                raise ResponsesError("'Output text' requires 'text'")
                            content.append({"text": part["text"], "type": "text"})
                        elif kind == "refusal":
                            if not _is_str(part, "refusal"):
                                raise ResponsesError("'Refusal' requires 'refusal'")
                            content.append({"refusal": part["refusal"], "type": "refusal"})
                        else:
                            raise ResponsesError("'type' must be one of 'output_text' or 'refusal'")
                if merge_prev:
                    if not _is_arr(msgs[-1], "content"):
                        msgs[-1]["content"] = []
                    msgs[-1]["content"].extend(content)
                else:
                    item.pop("status", None)
                    item.pop("type", None)
                    item["content"] = content
                    msgs.append(item)
            elif all(_is_str(item, k) for k in ("arguments", "call_id", "name", "type")) \
                    and item["type"] == "function_call":
                call = {"function": {"arguments": item["arguments"], "name": item["name"]}, "id": item["call_id"],
                        "type": "function"}
                if merge_prev:
                    msgs[-1].setdefault("tool_calls", [])
                    if not isinstance(msgs[-1]["tool_calls"], list):
                        msgs[-1]["tool_calls"] = []
                    msgs[-1]["tool_calls"].append(call)
                else:
                    msgs.append({"role": "assistant", "tool_calls": [call]})
            elif _is_str(item, "call_id") and (_is_str(item, "output") or _is_arr(item, "output")) \
                    and _is_str(item, "type") and item["type"] == "function_call_output":
                if isinstance(item["output"], str):
                    msgs.append({"content": item["output"], "role": "tool", "tool_call_id": item["call_id"]})
                else:
                    outs = item["output"]
                    for o in outs:
                        if not isinstance(o, dict) or "type" not in o:
                            raise ResponsesError("Output of tool call missing 'type' field")
                        if o["type"] not in ("input_text", "input_image"):
                            raise ResponsesError("Output of tool call should be 'Input text' or 'Input image'")
                        if o["type"] == "input_text":
                            o["type"] = "text"
                        else:
                            if "image_url" not in o:
                                raise ResponsesError("'image_url' is required")
                            o["type"] = "image_url"
                            o["image_url"] = {"url": o["image_url"]}
                    msgs.append({"content": outs, "role": "tool", "tool_call_id": item["call_id"]})
            elif _is_arr(item, "summary") and _is_str(item, "type") and item["type"] == "reasoning":
                if not _is_arr(item, "content"):
                    raise ResponsesError("item['content'] is not an array")
                if not item["content"]:
                    raise ResponsesError("item['content'] is empty")
                if not _is_str(item["content"][0], "text"):
                    raise ResponsesError("item['content']['text'] is not a string")
                text = item["content"][0]["text"]
                if merge_prev:
                    msgs[-1]["reasoning_content"] = text
                else:
                    msgs.append({"role": "assistant", "content": [], "reasoning_content": text})
            else:
                raise ResponsesError("Cannot determine type of 'item'")
    else:
        raise ResponsesError("'input' must be a string or array of objects")
    out["messages"] = msgs
    if "tools" in body:
        if not isinstance(body["tools"], list):
            raise ResponsesError("'tools' must be an array of objects")
        tools = []
        for t in body["tools"]:
            t = dict(t) if isinstance(t, dict) else {}
            kind = t.get("type", "") if isinstance(t.get("type"), str) else ""
            if kind != "function":
                log.warning("unsupported Responses tool type '%s' skipped", kind)
                continue
            t.pop("type")
            t.setdefault("strict", True)
            tools.append({"type": "function", "function": t})
        out.pop("tools", None)
        if tools:
            out["tools"] = tools
    if "max_output_tokens" in body:
        out.pop("max_output_tokens")
        out["max_tokens"] = body["max_output_tokens"]
    if "reasoning" in body:
        r = body["reasoning"]
        if isinstance(r, dict) and "effort" in r:
            out["reasoning_effort"] = r["effort"]
        out.pop("reasoning")
    return out


# ------------------------------------------------------------------------------------ answers


def new_state() -> dict:
    """A task's task_result_state for this API: its response and message ids (gen_chatcmplid-like)."""
    import secrets
    return {"resp_id": "resp_" + secrets.token_hex(16), "msg_id": "msg_" + secrets.token_hex(16),
            "created": False, "text_started": False}


def _usage(r: dict) -> dict:
    return {"input_tokens": r["tokens_evaluated"], "output_tokens": r["tokens_predicted"],
            "total_tokens": r["tokens_predicted"] + r["tokens_evaluated"],
            "input_tokens_details": {"cached_tokens": r["timings"]["cache_n"]}}


def _text_part(content: str) -> dict:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": content}


def final_json(resp_id: str, msg_id: str, model: str, r: dict, content: str, now: int) -> dict:
    """server_task_result_cmpl_final::to_json_oaicompat_resp (content only: no reasoning, no tool calls)."""
    output = []
    if content:
        output.append({"content": [_text_part(content)], "id": msg_id, "role": "assistant", "status": "completed",
                       "type": "message"})
    return {"completed_at": now, "created_at": now, "id": resp_id, "model": model, "object": "response",
            "output": output, "status": "completed", "usage": _usage(r)}


def _in_progress(kind: str, resp_id: str) -> dict:
    return {"event": kind, "data": {"type": kind, "response": {"id": resp_id, "object": "response",
                                                               "status": "in_progress"}}}


def partial_events(st: dict, text: str, is_progress: bool, n_decoded: int, timings, progress) -> list[dict]:
    """server_task_result_cmpl_partial::to_json_oaicompat_resp; `st` is the task's stream state
    (resp_id, msg_id, created, text_started), updated as the server's task_result_state."""
    events = []
    if not st["created"]:
        events += [_in_progress("response.created", st["resp_id"]), _in_progress("response.in_progress", st["resp_id"])]
    elif is_progress:
        events.append(_in_progress("response.in_progress", st["resp_id"]))
    if is_progress or n_decoded == 1:
        st["created"] = True
    if text:
        if not st["text_started"]:
            events.append({"event": "response.output_item.added", "data": {
                "type": "response.output_item.added",
                "item": {"content": [], "id": st["msg_id"], "role": "assistant", "status": "in_progress",
                         "type": "message"}}})
            events.append({"event": "response.content_part.added", "data": {
                "type": "response.content_part.added", "item_id": st["msg_id"],
                "part": {"type": "output_text", "text": ""}}})
            st["text_started"] = True
        events.append({"event": "response.output_text.delta", "data": {
            "type": "response.output_text.delta", "item_id": st["msg_id"], "delta": text}})
    if events:
        data = events[-1]["data"]
        if timings is not None:
            data["timings"] = timings
        if progress is not None:
            data["prompt_progress"] = progress
    return events


def final_events(st: dict, model: str, r: dict, content: str, now: int) -> list[dict]:
    """to_json_oaicompat_resp_stream: the text's done events, then response.completed with the timings."""
    events, output = [], []
    if content:
        part = _text_part(content)
        events.append({"event": "response.output_text.done", "data": {
            "type": "response.output_text.done", "item_id": st["msg_id"], "text": content}})
        events.append({"event": "response.content_part.done", "data": {
            "type": "response.content_part.done", "item_id": st["msg_id"], "part": part}})
        item = {"type": "message", "status": "completed", "id": st["msg_id"], "content": [part], "role": "assistant"}
        events.append({"event": "response.output_item.done", "data": {"type": "response.output_item.done",
                                                                       "item": item}})
        output.append(item)
    events.append({"event": "response.completed", "data": {"type": "response.completed", "response": {
        "id": st["resp_id"], "object": "response", "created_at": now, "status": "completed", "model": model,
        "output": output, "usage": _usage(r)}}})
    events[-1]["data"]["timings"] = r["timings"]
    return events
