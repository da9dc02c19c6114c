"""llama.cpp's built-in (non-Jinja) chat templates: `llama_chat_apply_template` and the names it knows.

llama-server renders through these with `--no-jinja` (`common_chat_templates_apply_legacy`), where the
template is either a name from `llama_chat_builtin_templates` (`--chat-template llama3`) or a Jinja
source that llama.cpp recognises by its markers. Calling the same C function renders byte-identical
prompts without re-implementing each family's format."""

from __future__ import annotations

import ctypes

from slotlab.llama import _lib
from slotlab.llama._lib import lib


def builtin_template_names() -> list[str]:
    """The names `--chat-template` accepts without --jinja (`llama_chat_builtin_templates`)."""
    _lib.init()
    n = lib.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    n = lib.llama_chat_builtin_templates(arr, n)
    return [arr[i].decode("utf-8") for i in range(n)]


def apply_builtin(template: str, messages: list[tuple[str, str]], add_assistant: bool) -> str:
    """Render (role, content) pairs with the built-in template named or recognised by `template`;
    ValueError when llama.cpp does not know it (the server's "this custom template is not supported")."""
    _lib.init()
    chat = (lib.llama_chat_message * max(len(messages), 1))()
    keep = []  # the C strings must outlive the calls
    alloc = 0
    for i, (role, content) in enumerate(messages):
        r, c = role.encode("utf-8"), content.encode("utf-8")
        keep += [r, c]
        chat[i].role, chat[i].content = r, c
        size = len(r) + len(c)
        alloc += size + size // 4  # the server's first guess (msg_size * 1.25)
    src = template.encode("utf-8")
    buf = ctypes.create_string_buffer(max(alloc, 1))
    res = lib.llama_chat_apply_template(src, chat, len(messages), add_assistant, buf, len(buf))
    if res < 0:
        raise ValueError("this custom template is not supported, try using --jinja")
    if res > len(buf):
        buf = ctypes.create_string_buffer(res)
        res = lib.llama_chat_apply_template(src, chat, len(messages), add_assistant, buf, len(buf))
        if res < 0 or res > len(buf):
            raise ValueError("failed to apply chat template, try using --jinja")
    return buf.raw[:res].decode("utf-8", errors="replace")


def special_texts(model) -> dict:
    """What `common_chat_templates_init` reads from the vocabulary: the BOS/EOS pieces a template
    sees as `bos_token`/`eos_token` ("" when the vocabulary has none) and whether tokenizing adds
    them (the rendered prompt loses a leading BOS / trailing EOS text then, so it is not doubled)."""
    def piece(tok: int) -> str:
        return "" if tok < 0 else model.token_to_piece(tok, special=True).decode("utf-8", "replace")

    return {"bos_token": piece(lib.llama_vocab_bos(model.vocab)), "eos_token": piece(lib.llama_vocab_eos(model.vocab)),
            "add_bos": bool(lib.llama_vocab_get_add_bos(model.vocab)),
            "add_eos": bool(lib.llama_vocab_get_add_eos(model.vocab))}
