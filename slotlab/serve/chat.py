"""Chat messages to a prompt, as llama-server renders them (common/chat.cpp).

Which template: `--chat-template NAME|JINJA` / `--chat-template-file`, else the GGUF's own
`tokenizer.chat_template`, else (or for the name "chatml") llama.cpp's ChatML default — this Gemma 3
GGUF has none, so the server uses ChatML. With `--jinja` (the default) the template is rendered as
Jinja (slotlab.serve.jinja_env) with the server's context: messages as `to_json_oaicompat` writes
them, bos_token/eos_token, enable_thinking, datetime/date_string, the chat_template_kwargs and the
preserve-reasoning switches; the workarounds the server applies first (developer -> system, a system
message merged into the first user message when the template ignores it, typed/string content); a
leading BOS text dropped when tokenizing adds one. Without --jinja the prompt comes from llama.cpp's
built-in templates (`llama_chat_apply_template`), where the template may be a built-in name.

A conversation ending in an assistant message is continued (prefill): the template's generation
prompt with the reasoning markers the server's template analysis finds, then that message's text."""

from __future__ import annotations

import time
from pathlib import Path

import jinja2

from slotlab.llama.chat_builtin import apply_builtin, special_texts
from slotlab.serve import chat_request as cr
from slotlab.serve.delimiters import message_delimiters
from slotlab.serve.jinja_env import NOW, TemplateRaised, make_environment
from slotlab.serve.template_caps import detect_caps
from slotlab.serve.template_diff import Reasoning, analyze_reasoning

# CHATML_TEMPLATE_SRC: a C string, so the newlines inside the Jinja string literals are real ones
CHATML = ("{%- for message in messages -%}\n"
          "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
          "{%- endfor -%}\n"
          "{%- if add_generation_prompt -%}\n"
          "  {{- '<|im_start|>assistant\n' -}}\n"
          "{%- endif -%}")

# common_chat_templates_init's source patches (templates that would otherwise raise on valid input)
_PATCHES = [
    ("<|channel|>", "in message.content or",
     "{%- if \"<|channel|>analysis<|message|>\" in message.content or "
     "\"<|channel|>final<|message|>\" in message.content %}"),
    ("[TOOL_CALLS]", "if (message['content'] is none or",
     "{%- if (message['content'] is none or message['content'] == '' or "
     "message['content']|length == 0) and (message['tool_calls'] is not defined or "
     "message['tool_calls'] is none or message['tool_calls']|length == 0) %}"),
]


class ChatTemplateError(Exception):
    """Rendering failed inside the template (the server answers 500 with this text)."""


def _kwargs_from_params(value) -> dict[str, str]:
    """`--chat-template-kwargs` as common_params keeps it: name -> JSON text."""
    import json

    if not value:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    out = {}
    for k, v in dict(value).items():
        if isinstance(v, str):
            try:
                json.loads(v)
                out[k] = v
                continue
            except ValueError:
                pass
        out[k] = json.dumps(v, ensure_ascii=False)
    return out


class ChatTemplate:
    def __init__(self, model, params=None):
        p = params
        self.use_jinja = bool(getattr(p, "use_jinja", True))
        override = getattr(p, "chat_template", "") or ""
        path = getattr(p, "chat_template_file", None)
        if path and not override:
            override = Path(path).read_text(encoding="utf-8")
        self.prefill_assistant = bool(getattr(p, "prefill_assistant", True))
        self.server_build = int(getattr(p, "server_build", 11312) or 11312)  # whose request rules (b11549: stricter)
        self.kwargs = _kwargs_from_params(getattr(p, "default_template_kwargs", None)
                                          or getattr(p, "chat_template_kwargs", None))
        # common_params_parse: preserve_reasoning defaults to on unless given
        self.kwargs.setdefault("preserve_reasoning", "true")
        enable_reasoning = getattr(p, "enable_reasoning", -1)

        own = model.chat_template() if not override else None
        src = override or own or ""
        self.is_default = src in ("", "chatml")
        if self.is_default:
            src = CHATML
        for marker, needle, old in _PATCHES:
            if marker in src and needle in src:
                src = src.replace(old, "{%- if false %}")
        # common_chat_template keeps the lexer's source: newlines normalised, one trailing newline dropped
        src = src.replace("\r\n", "\n").replace("\r", "\n")
        if src.endswith("\n"):
            src = src[:-1]
        self.source = src
        sp = special_texts(model)
        self.bos, self.eos = sp["bos_token"], sp["eos_token"]
        self.add_bos, self.add_eos = sp["add_bos"], sp["add_eos"]
        self.is_gpt_oss = "<|channel|>" in src
        self.reasoning = Reasoning()
        self.supports_thinking = False
        self._delimiters: list[dict] | None = None
        if self.use_jinja:
            try:
                self.template = make_environment().from_string(src)
            except jinja2.TemplateSyntaxError as e:
                raise ValueError(f"chat template parsing error: {e}") from None
            self.caps = detect_caps(src)
            if self.is_gpt_oss:
                self.supports_thinking = True
            else:
                self.reasoning = analyze_reasoning(self._probe_render, src)
                self.supports_thinking = self.reasoning.mode != "none"
        elif override:
            try:
                apply_builtin(override, [("user", "test")], True)
            except ValueError:
                raise ValueError(f"error: the supplied chat template is not supported: {override}\nnote: llama.cpp "
                                 "was started without --jinja, we only support commonly used templates") from None
        self.enable_thinking = enable_reasoning != 0 and self.use_jinja and self.supports_thinking
        if self.use_jinja and override:
            # common_chat_verify_template: a given template must render one user message
            try:
                self.apply([{"role": "user", "content": "test"}])
            except (ChatTemplateError, cr.ChatRequestError):
                raise ValueError(f"error: the supplied chat template is not supported: {override}") from None

    # ---------------------------------------------------------------- public API

    def apply(self, messages: list[dict], add_generation_prompt: bool = True, now: float | None = None) -> str:
        """The prompt for OpenAI-style messages (the chat endpoint's path, prefill included)."""
        if not isinstance(messages, list):
            raise cr.ChatRequestError("Expected 'messages' to be an array")
        return self.apply_request({"messages": messages, "add_generation_prompt": add_generation_prompt}, now)

    def apply_request(self, body: dict, now: float | None = None) -> str:
        """The prompt for a chat request body, as `/apply-template` answers it; `now` (epoch seconds)
        fixes the clock the template sees (date strings), else the current time."""
        inp = cr.parse_request(body, use_jinja=self.use_jinja, prefill_assistant=self.prefill_assistant,
                               enable_thinking=self.enable_thinking, default_kwargs=self.kwargs,
                               server_build=self.server_build)
        if not self.use_jinja:
            return self._apply_legacy(inp)
        return self._apply_jinja(inp, time.time() if now is None else now)

    def delimiters(self) -> list[dict]:
        """The `message_delimiters` the chat path sends (slotlab.serve.delimiters): derived from the
        template as the server's autoparser or specialized parser does; none without --jinja."""
        if not self.use_jinja:
            return []
        if self._delimiters is None:
            self._delimiters = message_delimiters(self.source, self._probe_render, self.reasoning)
        return [dict(d) for d in self._delimiters]

    # ---------------------------------------------------------------- rendering

    def _apply_legacy(self, inp: cr.ChatInputs) -> str:
        pairs = []
        for m in inp.messages:
            content = m.content
            for part in m.content_parts:
                content = content + "\n" + part["text"] if content else part["text"]
            pairs.append((m.role, content))
        return apply_builtin(self.source, pairs, inp.add_generation_prompt)

    def _normalize(self, messages: list[dict]) -> list[dict]:
        """messages_inp_normalizer: string <-> typed content to what the template reads."""
        only_string = self.caps.supports_string_content and not self.caps.supports_typed_content
        only_typed = self.caps.supports_typed_content and not self.caps.supports_string_content
        if not (only_string or only_typed):
            return messages
        out = []
        for m in messages:
            m = dict(m)
            c = m.get("content")
            if only_typed and isinstance(c, str):
                m["content"] = [{"type": "text", "text": c}]
            elif only_string and isinstance(c, list):
                text, after_media = "", False
                for part in c:
                    if part.get("type") == "text":
                        if not after_media and text:
                            text += "\n"
                        after_media = False
                    elif part.get("type") == "media_marker":
                        after_media = True
                    else:
                        continue
                    text += part.get("text", "")
                m["content"] = text
            out.append(m)
        return out

    def _render(self, messages: list[dict], agp: bool, extra: dict, tools: list | None, now: float,
                strip: bool = True) -> str:
        """`common_chat_template_direct_apply_impl`."""
        ctx = {"messages": messages, "bos_token": self.bos, "eos_token": self.eos,
               "enable_thinking": extra.pop("__enable_thinking")}
        if tools:
            ctx["tools"] = tools
        ctx.update(extra)
        if agp:
            ctx["add_generation_prompt"] = True
        if isinstance(ctx.get("preserve_reasoning"), bool):
            on = ctx["preserve_reasoning"]
            ctx.update(preserve_thinking=on, clear_thinking=not on, truncate_history_thinking=not on,
                       drop_thinking=not on)
        effort = ctx.get("reasoning_effort")
        if isinstance(effort, str) and effort:
            ctx["reasoning_strength"] = effort
        ctx[NOW] = now
        try:
            out = self.template.render(ctx)
        except TemplateRaised as e:
            raise ChatTemplateError(str(e)) from None
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template rendering failed: {e}") from None
        if strip and self.add_bos and self.bos and out.startswith(self.bos):
            out = out[len(self.bos):]
        if strip and self.add_eos and self.eos and out.endswith(self.eos):
            out = out[:-len(self.eos)]
        return out

    def _probe_render(self, messages: list, agp: bool, enable_thinking: bool) -> str | None:
        """A render of the template analysis (autoparser `apply_template`): no dates, no BOS strip."""
        try:
            return self._render(self._normalize(messages), agp, {"__enable_thinking": enable_thinking,
                                                                 "enable_thinking": enable_thinking},
                                None, time.time(), strip=False)
        except ChatTemplateError:
            return None

    def _extra(self, inp: cr.ChatInputs, now: float) -> dict:
        import json

        lt = time.localtime(now)
        extra = {"datetime": time.strftime("%b %d %Y", lt), "date_string": time.strftime("%d %b %Y", lt)}
        for k, v in inp.kwargs.items():
            extra[k] = json.loads(v)
        extra["__enable_thinking"] = inp.enable_thinking
        return extra

    def _apply_jinja(self, inp: cr.ChatInputs, now: float) -> str:
        msgs = list(inp.messages)
        src = self.source
        if "You have access to the following functions in JSONSchema format" in src:  # StepFun: trimmed
            msgs = [cr.Message(**{**m.__dict__, "content": m.content.strip(), "reasoning_content":
                                  m.reasoning_content.strip(),
                                  "content_parts": [{**p, "text": p["text"].strip()} if p["type"] == "text" else p
                                                    for p in m.content_parts]}) for m in msgs]
        messages = self._normalize([m.to_json() for m in msgs])
        agp, cont, cont_msg = inp.add_generation_prompt, inp.continue_final_message, None
        if cont != cr.NONE:
            agp = False
            if inp.messages:
                cont_msg = inp.messages[-1]
                messages = messages[:-1]
            if cont == cr.AUTO and inp.messages:
                cont = cr.CONTENT
                if cont_msg.reasoning_content and not cont_msg.content and not cont_msg.content_parts:
                    cont = cr.REASONING
        if not self.is_gpt_oss:
            messages = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
        if not self.caps.supports_system_role and messages and messages[0].get("role") == "system":
            if len(messages) > 1:
                merged = dict(messages[1])
                merged["content"] = messages[0]["content"] + "\n" + messages[1]["content"]
                messages = [merged, *messages[2:]]
            else:
                messages = messages[1:]
        tools = inp.tools or None

        def render(ms, with_agp):
            return self._render(ms, with_agp, self._extra(inp, now), tools, now)

        def generation_prompt(ms):
            a, b = render(ms, False), render(ms, True)
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return b[n:]

        if self.is_gpt_oss:
            adjusted = []
            for m in messages:
                m = dict(m)
                if isinstance(m.get("reasoning_content"), str):
                    m["thinking"] = m["reasoning_content"]
                    if m.get("tool_calls"):
                        m.pop("content", None)
                adjusted.append(m)
            prompt = render(adjusted, agp)
            if not agp:
                pos = prompt.rfind("<|return|>")
                if pos != -1:
                    prompt = prompt[:pos] + "<|end|>" + prompt[pos + len("<|return|>"):]
            if cont != cr.NONE and cont_msg is not None:
                gp = "<|start|>assistant<|channel|>analysis<|message|>" + cont_msg.reasoning_content
                if cont == cr.CONTENT:
                    gp += "<|end|><|start|>assistant<|channel|>final<|message|>" + cont_msg.render_content()
                prompt += gp
            return prompt

        prompt = render(messages, agp)
        if cont != cr.NONE and cont_msg is not None:
            gp = generation_prompt(messages)
            r = self.reasoning
            if r.start:
                cut = gp.find(r.start)
                gp = (gp if cut == -1 else gp[:cut]) + r.start + cont_msg.reasoning_content
                if cont == cr.CONTENT:
                    gp += r.end
            if cont == cr.CONTENT:
                gp += cont_msg.render_content()
            prompt += gp
        return prompt
