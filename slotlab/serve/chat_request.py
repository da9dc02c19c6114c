"""A chat request's fields that decide the prompt, read and checked as llama-server does
(`oaicompat_chat_params_parse` in tools/server/server-common.cpp and `common_chat_msgs_parse_oaicompat`
in common/chat.cpp), with the server's error texts and status codes.

The server turns a conversation that ends in an assistant message into a continuation of that message
("prefill", on by default): no generation prompt, and the last message rendered open."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from slotlab.serve import nljson as J

NONE, AUTO, CONTENT, REASONING = "none", "auto", "content", "reasoning"


class ChatRequestError(ValueError):
    """A request the server refuses; `code` is its HTTP status (invalid_argument -> 400, other -> 500)."""

    def __init__(self, message: str, code: int = 400):
        super().__init__(message)
        self.code = code


def _dump(v) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Message:
    """`common_chat_msg`: what the server keeps of one OpenAI message."""
    role: str
    content: str = ""
    content_parts: list[dict] = field(default_factory=list)
    reasoning_content: str = ""
    tool_name: str = ""
    tool_call_id: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    def render_content(self, delimiter: str = "\n\n") -> str:
        if self.content:
            return self.content
        return delimiter.join(p["text"] for p in self.content_parts if p["type"] == "text")

    def to_json(self) -> dict:
        """`to_json_oaicompat`: the message as the template sees it (content always present)."""
        j: dict = {"role": self.role}
        if self.content:
            j["content"] = self.content
        elif self.content_parts:
            j["content"] = [{"type": p["type"], "text": p["text"]} for p in self.content_parts]
        else:
            j["content"] = ""
        if self.reasoning_content:
            j["reasoning_content"] = self.reasoning_content
        if self.tool_name:
            j["name"] = self.tool_name
        if self.tool_call_id:
            j["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            j["tool_calls"] = [{"type": "function", "function": {"name": t["name"], "arguments": t["arguments"]},
                                **({"id": t["id"]} if t.get("id") else {})} for t in self.tool_calls]
        return j


def _str(obj: dict, key: str) -> str:
    """`obj.at(key)` read as a std::string: nlohmann's texts for a missing key or another type."""
    return J.get_str(J.at(obj, key))


def _contains(v, key: str) -> bool:
    """basic_json::contains: false for anything but an object."""
    return isinstance(v, dict) and key in v


def parse_messages(messages) -> list[Message]:
    """`common_chat_msgs_parse_oaicompat`, step by step as there, so a malformed message gets the
    server's text: its own checks, and nlohmann's for a field of another type (`role: 1` is
    `[json.exception.type_error.302] type must be string, but is number`). Its errors are
    runtime_error: 500."""
    out = []
    try:
        if not isinstance(messages, list):
            raise ValueError(f"Expected 'messages' to be an array, got {_dump(messages)}")
        for m in messages:
            if not isinstance(m, dict):
                raise ValueError(f"Expected 'message' to be an object, got {_dump(m)}")
            if "role" not in m:
                raise ValueError(f"Missing 'role' in message: {_dump(m)}")
            msg = Message(role=_str(m, "role"))
            if "content" in m:
                content = m["content"]
                if isinstance(content, str):
                    msg.content = content
                elif isinstance(content, list):
                    for part in content:
                        if not _contains(part, "type"):
                            raise ValueError(f"Missing content part type: {_dump(part)}")
                        if part["type"] not in ("text", "media_marker"):
                            raise ValueError(f"Unsupported content part type: {_dump(part['type'])}")
                        msg.content_parts.append({"type": part["type"], "text": _str(part, "text")})
                elif content is not None:
                    raise ValueError(f"Invalid 'content' type: expected string or array, got {_dump(content)} "
                                     "(ref: https://github.com/ggml-org/llama.cpp/issues/8367)")
            if "tool_calls" in m:
                for tc in J.items(m["tool_calls"]):  # a range-for: a string is one element, null none
                    if not _contains(tc, "type"):
                        raise ValueError(f"Missing tool call type: {_dump(tc)}")
                    if tc["type"] != "function":
                        raise ValueError(f"Unsupported tool call type: {_dump(tc)}")
                    if "function" not in tc:
                        raise ValueError(f"Missing tool call function: {_dump(tc)}")
                    fn = tc["function"]
                    if not _contains(fn, "name"):
                        raise ValueError(f"Missing tool call name: {_dump(tc)}")
                    name = _str(fn, "name")
                    args = J.at(fn, "arguments")
                    msg.tool_calls.append({"name": name, "id": _str(tc, "id") if "id" in tc else "",
                                           "arguments": args if isinstance(args, str) else _dump(args)})
            if "content" not in m and "tool_calls" not in m:
                raise ValueError("Expected 'content' or 'tool_calls' (ref: https://github.com/ggml-org/llama.cpp/"
                                 "issues/8367 & https://github.com/ggml-org/llama.cpp/issues/12279)")
            if "reasoning_content" in m:
                msg.reasoning_content = _str(m, "reasoning_content")
            if "name" in m:
                msg.tool_name = _str(m, "name")
            if "tool_call_id" in m:
                msg.tool_call_id = _str(m, "tool_call_id")
            out.append(msg)
    except (ValueError, J.JsonError) as e:
        raise ChatRequestError(f"Failed to parse messages: {e}", 500) from None
    return out


def parse_tools(tools) -> list[dict]:
    """`common_chat_tools_parse_oaicompat` + `..._to_json_oaicompat`: the tools as templates see them;
    a field of another type is nlohmann's text (`function.at("name")` on a string: type_error.304)."""
    if tools is None:
        return []
    out = []
    try:
        if not isinstance(tools, list):
            raise ValueError(f"Expected 'tools' to be an array, got {_dump(tools)}")
        for t in tools:
            if not _contains(t, "type"):
                raise ValueError(f"Missing tool type: {_dump(t)}")
            if t["type"] != "function":
                raise ValueError(f"Unsupported tool type: {_dump(t)}")
            if "function" not in t:
                raise ValueError(f"Missing tool function: {_dump(t)}")
            fn = t["function"]
            name = _str(fn, "name")
            desc = J.get_str(fn["description"]) if "description" in fn else ""  # value("description", "")
            out.append({"type": "function", "function": {"name": name, "description": desc,
                                                          "parameters": fn.get("parameters", {})}})
    except (ValueError, J.JsonError) as e:
        raise ChatRequestError(f"Failed to parse tools: {e}; tools = {json.dumps(tools, indent=2, ensure_ascii=False)}",
                               500) from None
    return out


TOOL_CHOICES = ("auto", "none", "required")
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def reasoning_format(v) -> str:
    """common_reasoning_format_from_name of a JSON value (a non-string: nlohmann's type error)."""
    name = J.get_str(v)
    if name not in REASONING_FORMATS:
        raise ValueError(f"Unknown reasoning format: {name}")
    return name


@dataclass
class ChatInputs:
    """`common_chat_templates_inputs`, as far as it decides the prompt."""
    messages: list[Message]
    tools: list[dict]
    add_generation_prompt: bool = True
    continue_final_message: str = NONE
    enable_thinking: bool = False
    kwargs: dict = field(default_factory=dict)  # name -> JSON text, like chat_template_kwargs


def _continuation(value, strict: bool = False) -> str:
    """`continue_final_message`: the pin takes any other value as not continuing; b11549
    (`common_chat_continuation_parse`, common/chat.cpp:591-608 there) refuses it (`strict`): 400."""
    if value is True:
        return AUTO
    if value == "reasoning_content":
        return REASONING
    if value == "content":
        return CONTENT
    if strict and not (value is None or value is False):
        raise ChatRequestError('Invalid continue_final_message: expected a boolean, "content" or "reasoning_content"')
    return NONE


_MEDIA = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def _check_media(content: list) -> None:
    """oaicompat_content_load_media without a multimodal projector: a media part is the server's
    runtime_error (500), any other part but text its invalid_argument (400)."""
    for part in content:
        kind = part.get("type") if isinstance(part, dict) and isinstance(part.get("type"), str) else ""
        if kind in _MEDIA:
            raise ChatRequestError(f"{_MEDIA[kind]} input is not supported - hint: if this is unexpected, you may "
                                   "need to provide the mmproj", 500)
        if kind != "text":
            raise ChatRequestError("unsupported content[].type")


def parse_request(body: dict, *, use_jinja: bool, prefill_assistant: bool, enable_thinking: bool,
                  default_kwargs: dict[str, str], server_build: int = 11312) -> ChatInputs:
    """The prompt-deciding part of `oaicompat_chat_params_parse` (of `server_build`'s rules)."""
    tools = body.get("tools")
    has_tools = isinstance(tools, list) and len(tools) > 0
    tool_choice = J.json_value(body, "tool_choice", "auto", J.get_str)  # not a string: "auto"
    if not use_jinja:
        if has_tools:  # runtime_error: 500
            raise ChatRequestError("tools param requires --jinja flag", 500)
        if tool_choice != "auto":
            raise ChatRequestError("tool_choice param requires --jinja flag", 500)
    if "messages" not in body:
        raise ChatRequestError("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise ChatRequestError("Expected 'messages' to be an array")
    for m in messages:
        role = m.get("role") if isinstance(m, dict) and isinstance(m.get("role"), str) else ""
        has_content = isinstance(m, dict) and "content" in m
        if role != "assistant" and not has_content:
            raise ChatRequestError("All non-assistant messages must contain 'content'")
        if role == "assistant" and not has_content and "tool_calls" not in m:
            raise ChatRequestError("Assistant message must contain either 'content' or 'tool_calls'!")
        c = m.get("content") if has_content else None
        if c is not None and not isinstance(c, (str, list)):
            raise ChatRequestError("Expected 'content' to be a string or an array")
        if isinstance(c, list):
            _check_media(c)
    inp = ChatInputs(messages=parse_messages(messages), tools=parse_tools(tools) if use_jinja else [])
    if tool_choice not in TOOL_CHOICES:  # common_chat_tool_choice_parse_oaicompat: invalid_argument
        raise ChatRequestError(f"Invalid tool_choice: {tool_choice}")
    agp = body.get("add_generation_prompt", True)
    inp.add_generation_prompt = bool(agp) if agp is not None else True
    inp.continue_final_message = (_continuation(body["continue_final_message"], server_build >= 11549)
                                  if "continue_final_message" in body else NONE)
    msgs = inp.messages
    if inp.continue_final_message == NONE and prefill_assistant and msgs and msgs[-1].role == "assistant":
        if len(msgs) >= 2 and msgs[-2].role == "assistant":
            raise ChatRequestError("Cannot have 2 or more assistant messages at the end of the list.")
        inp.continue_final_message = AUTO
        inp.add_generation_prompt = False
    if inp.continue_final_message != NONE and inp.add_generation_prompt:
        raise ChatRequestError("Cannot set both add_generation_prompt and continue_final_message to true.")
    if inp.continue_final_message != NONE and msgs and msgs[-1].role == "assistant" and msgs[-1].tool_calls:
        raise ChatRequestError("Cannot continue an assistant message that contains tool calls.")
    if "reasoning_format" in body:  # body.at("reasoning_format").get<std::string>(): runtime errors, 500
        try:
            reasoning_format(body["reasoning_format"])
        except (ValueError, J.JsonError) as e:
            raise ChatRequestError(str(e), 500) from None
    inp.enable_thinking = enable_thinking
    inp.kwargs = dict(default_kwargs)
    extra = body.get("chat_template_kwargs")
    # json_value(..., json::object()) keeps any value; items() of an array keys its elements "0", "1", ...;
    # of a scalar, one item keyed "" (neither reaches a template's variables)
    extra = extra if isinstance(extra, dict) else {}
    for k, v in extra.items():
        inp.kwargs[k] = json.dumps(v, ensure_ascii=False)
    et = inp.kwargs.get("enable_thinking", "")
    if et == "true":
        inp.enable_thinking = True
    elif et == "false":
        inp.enable_thinking = False
    elif et.startswith('"'):
        raise ChatRequestError('invalid type for "enable_thinking" (expected boolean, got string)')
    if "reasoning_effort" in body:
        effort = body.get("reasoning_effort") or ""
        if effort == "none":
            inp.enable_thinking = False
            inp.kwargs.pop("reasoning_effort", None)
        elif effort:
            inp.kwargs["reasoning_effort"] = json.dumps(effort)
    return inp
