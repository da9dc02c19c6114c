"""A request's `prompt` (and `/tokenize`'s `content`) into token lists, as the server reads them
(`tokenize_input_prompts`, `tokenize_input_subprompt`, `tokenize_mixed`, SCM:867-1028).

One prompt is a string, an array of token ids, a mixed array of strings and ids (only a leading
string gets BOS), or `{"prompt_string": ...}`. An array that holds no integer is a batch: each element
is a prompt of its own, and the answer has one result per prompt (`index` = its position). Errors
carry the server's texts; the completion handler answers them 400 (they are raised inside its try),
`/tokenize` 500 (outside any)."""

from __future__ import annotations

import numpy as np

from slotlab.serve import nljson as J
from slotlab.serve.errors import InvalidRequest

BAD_PROMPT = ("\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, "
              "or a list of mixed strings & tokens.")


def _is_int(e) -> bool:
    return isinstance(e, int) and not isinstance(e, bool)  # is_number_integer


def tokenize_mixed(model, p, add_special: bool, parse_special: bool) -> list[int]:
    if not isinstance(p, list):
        return model.tokenize(J.get_str(p), add_special=add_special, parse_special=parse_special).tolist()
    out: list[int] = []
    first = True
    for e in p:
        if isinstance(e, str):
            out += model.tokenize(e, add_special=add_special and first, parse_special=parse_special).tolist()
        else:
            out.append(J.get_int(e))
        first = False
    return out


def _subprompt(model, p) -> list[int]:
    mixed = isinstance(p, list) and any(isinstance(e, str) for e in p) and any(_is_int(e) for e in p)
    if isinstance(p, str) or mixed:
        return tokenize_mixed(model, p, True, True)
    if isinstance(p, list) and all(_is_int(e) for e in p):
        return [J.get_int(e) for e in p]
    if isinstance(p, dict) and "prompt_string" in p:
        if "multimodal_data" in p:
            raise InvalidRequest("Multimodal data provided, but model does not support multimodal requests.")
        return tokenize_mixed(model, p["prompt_string"], True, True)
    raise InvalidRequest(BAD_PROMPT)


def tokenize_prompts(model, prompt) -> list[np.ndarray]:
    """Every prompt of the request, validated against the vocabulary ("Prompt contains invalid
    tokens", which the server answers at launch, SC:1754-1756)."""
    if isinstance(prompt, list) and not any(_is_int(e) for e in prompt):
        out = [_subprompt(model, p) for p in prompt]
    else:
        out = [_subprompt(model, prompt)]
    if not out:
        raise InvalidRequest("\"prompt\" must not be empty")
    arrays = []
    for toks in out:
        if any(t < 0 or t >= model.n_vocab for t in toks):
            raise InvalidRequest("Prompt contains invalid tokens")
        arrays.append(np.asarray(toks, dtype=np.int32))
    return arrays


def detokenize_checked(model, tokens) -> str:
    """`/detokenize`: `tokens_to_str` reads each piece with vector::at, so an id outside the
    vocabulary is libstdc++'s out_of_range text (a 500 in the server)."""
    if not isinstance(tokens, list):  # get<llama_tokens>()
        raise J.JsonError("type_error", 302, f"type must be array, but is {J.type_name(tokens)}")
    ids = [J.get_int(t) for t in tokens]
    for t in ids:
        if t < 0 or t >= model.n_vocab:
            raise IndexError(f"vector::_M_range_check: __n (which is {t % 2**64}) >= this->size() "
                             f"(which is {model.n_vocab})")
    return model.detokenize(ids)
