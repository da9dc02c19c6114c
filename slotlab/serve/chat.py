"""Chat messages to a prompt, as llama-server does for a model: the GGUF's own Jinja template when it
has one, else llama.cpp's ChatML default (this Gemma 3 GGUF has none, so the server uses ChatML), and
the message delimiters the server derives from the template so checkpoints land at user messages."""

from __future__ import annotations

import jinja2

CHATML = ("{%- for message in messages -%}\n"
          "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
          "{%- endfor -%}\n"
          "{%- if add_generation_prompt -%}\n"
          "  {{- '<|im_start|>assistant\\n' -}}\n"
          "{%- endif -%}")


class ChatTemplate:
    def __init__(self, model):
        own = model.chat_template()
        self.source = own if own is not None else CHATML
        self.is_default = own is None
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(self.source)
        self.bos = model.bos_text()

    def apply(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content", ""), str):
                raise ValueError("each message needs a \"role\" and a string \"content\" (multimodal content is not supported)")
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos, eos_token="")

    def delimiters(self) -> list[dict]:
        if self.is_default:
            return [{"role": "system", "delimiter": "<|im_start|>system\n"},
                    {"role": "user", "delimiter": "<|im_start|>user\n"},
                    {"role": "assistant", "delimiter": "<|im_start|>assistant\n"}]
        return []


def _raise(msg):
    raise jinja2.TemplateError(msg)
