"""The sampling fields of a request, read as llama-server reads them, and the token probabilities
written back as it writes them.

* `sampling_params(body, model)`: server-schema.cpp's sampling fields (limits, aliases, the
  `logit_bias` array and object forms with token ids or strings, `json_schema` / `grammar`) into a
  `slotlab.sampling.SamplingParams`; None when the body sets none of them beyond temperature / seed /
  ignore_eos, so such a request keeps the plain sampler the golden traces were recorded with.
* `chat_fields(body)`: what `oaicompat_chat_params_parse` does to the sampling fields of a chat
  request (`logprobs` / `top_logprobs` -> `n_probs`, `response_format` -> `json_schema`).
* `probs_json(...)`: `completion_token_output::probs_vector_to_json`.

Errors are `ValueError`s carrying the server's text (the HTTP layer answers 400)."""

from __future__ import annotations

import json
import math

from slotlab.sampling import SamplingParams, samplers_from_chars, samplers_from_names
from slotlab.serve.nljson import type_name as _type_name  # basic_json::type_name(), one copy

INT32_MAX = 2**31 - 1
FLT_LOWEST = -3.4028234663852886e38  # std::numeric_limits<float>::lowest()

# request fields that need the server's chain (temperature, seed and ignore_eos alone do not)
CHAIN_FIELDS = {
    "top_k", "top_p", "min_p", "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "dynatemp_range",
    "dynatemp_exponent", "repeat_last_n", "repeat_penalty", "frequency_penalty", "presence_penalty",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "mirostat_tau",
    "mirostat_eta", "adaptive_target", "adaptive_decay", "n_probs", "logprobs", "min_keep", "post_sampling_probs",
    "dry_sequence_breakers", "json_schema", "grammar", "logit_bias", "samplers",
}


def _has(body: dict, name: str) -> bool:
    return name in body and body[name] is not None  # has_value: null = absent


def _num(name: str, v, kind):
    """nlohmann's get<int|float>: numbers and booleans convert, anything else is a type error."""
    if isinstance(v, (bool, int, float)):
        return kind(v) if kind is float else int(v)  # a float into an int truncates, as static_cast
    raise ValueError(f"Field '{name}': [json.exception.type_error.302] type must be number, but is {_type_name(v)}")


def _to_string(x, is_float: bool) -> str:
    return f"{x:.6f}" if is_float else str(x)  # std::to_string


def _field(body: dict, names: tuple[str, ...], cur, *, kind=float, lo=None, hi=None, hard=False):
    """field_num::eval: the first name present; soft limits clamp, hard limits refuse."""
    for n in names:
        if _has(body, n):
            v = _num(n, body[n], kind)
            if hard and ((lo is not None and v < lo) or (hi is not None and v > hi)):
                f = kind is float
                raise ValueError(f"Field '{n}': Value must be between {_to_string(lo, f)} <= value <= "
                                 f"{_to_string(hi, f)}, but got {_to_string(v, f)}")
            if lo is not None:
                v = max(lo, v)
            if hi is not None:
                v = min(hi, v)
            return v
    return cur


def needs_server_sampler(body: dict) -> bool:
    return any(_has(body, k) for k in CHAIN_FIELDS)


def _logit_bias(model, lb) -> list[tuple[int, float]]:
    """The `logit_bias` handler: [[token|string, bias|false], ...] or {"token"|"string": bias|false};
    out-of-vocabulary ids and malformed entries are skipped, a string biases each of its tokens."""
    out: list[tuple[int, float]] = []

    def bias_of(v):
        if isinstance(v, bool):
            return -math.inf if v is False else None
        if isinstance(v, (int, float)):
            return float(v)
        return None

    def tokens_of(text: str) -> list[int]:  # common_tokenize(vocab, text, add_special=false)
        return model.tokenize(text, add_special=False, parse_special=False).tolist()

    if isinstance(lb, list):
        for el in lb:
            if not isinstance(el, list) or len(el) != 2:
                continue
            b = bias_of(el[1])
            if b is None:
                continue
            if isinstance(el[0], int) and not isinstance(el[0], bool):
                if 0 <= el[0] < model.n_vocab:
                    out.append((el[0], b))
            elif isinstance(el[0], str):
                out.extend((t, b) for t in tokens_of(el[0]))
    elif isinstance(lb, dict):
        for key, v in lb.items():
            b = bias_of(v)
            if b is None:
                continue
            tok = _strtol(key)
            if tok is not None:
                if 0 <= tok < model.n_vocab:
                    out.append((tok, b))
            else:
                out.extend((t, b) for t in tokens_of(key))
    return out


def _strtol(key: str) -> int | None:
    """strtol(key, &end, 10) with *end == 0: the whole key is a base-10 integer (leading blanks and
    a sign allowed); an empty key converts to 0."""
    s = key.lstrip(" \t\n\r\f\v")
    if s == "" and key == "":
        return 0
    try:
        if s and (s[0] in "+-" and s[1:].isdigit() or s.isdigit()):
            return int(s)
    except ValueError:
        pass
    return None


def json_schema_grammar(schema) -> str:
    """`json_schema_to_grammar`: an empty object schema means any object."""
    from slotlab.llama.grammar import json_schema_to_grammar

    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}
    from slotlab.serve.json_schema import SchemaError, check

    try:  # the C++ reader's refusals, in its words (slotlab.serve.json_schema)
        check(schema)
    except SchemaError as ex:
        raise ValueError(f"Field 'json_schema': \"json_schema\": JSON schema conversion failed:\n{ex}") from None
    try:
        return json_schema_to_grammar(schema)
    except Exception as ex:  # the converter's own message, as the server reports e.what()
        raise ValueError(f"Field 'json_schema': \"json_schema\": {ex}") from ex


def sampling_params(body: dict, model) -> SamplingParams | None:
    """The request's SamplingParams, or None when the plain sampler serves it (see module doc)."""
    if not needs_server_sampler(body):
        return None
    p = SamplingParams()
    p.top_k = _field(body, ("top_k",), p.top_k, kind=int, lo=0, hi=INT32_MAX)
    p.top_p = _field(body, ("top_p",), p.top_p, lo=0.0, hi=1.0)
    p.min_p = _field(body, ("min_p",), p.min_p, lo=0.0, hi=1.0)
    p.top_n_sigma = _field(body, ("top_n_sigma",), p.top_n_sigma)
    p.xtc_probability = _field(body, ("xtc_probability",), p.xtc_probability, lo=0.0, hi=1.0)
    p.xtc_threshold = _field(body, ("xtc_threshold",), p.xtc_threshold, lo=0.0, hi=1.0)
    p.typ_p = _field(body, ("typical_p",), p.typ_p)
    p.temp = _field(body, ("temperature",), p.temp, lo=0.0)
    p.dynatemp_range = _field(body, ("dynatemp_range",), p.dynatemp_range)
    p.dynatemp_exponent = _field(body, ("dynatemp_exponent",), p.dynatemp_exponent)
    p.penalty_last_n = _field(body, ("repeat_last_n",), p.penalty_last_n, kind=int, lo=0, hi=INT32_MAX, hard=True)
    p.penalty_repeat = _field(body, ("repeat_penalty",), p.penalty_repeat)
    p.penalty_freq = _field(body, ("frequency_penalty",), p.penalty_freq)
    p.penalty_present = _field(body, ("presence_penalty",), p.penalty_present)
    p.dry_multiplier = _field(body, ("dry_multiplier",), p.dry_multiplier)
    if _has(body, "dry_base"):
        v = _num("dry_base", body["dry_base"], float)
        p.dry_base = SamplingParams.dry_base if v < 1.0 else v
    p.dry_allowed_length = _field(body, ("dry_allowed_length",), p.dry_allowed_length, kind=int, lo=0, hi=INT32_MAX,
                                  hard=True)
    p.dry_penalty_last_n = _field(body, ("dry_penalty_last_n",), p.dry_penalty_last_n, kind=int, lo=0, hi=INT32_MAX,
                                  hard=True)
    p.mirostat = _field(body, ("mirostat",), p.mirostat, kind=int, lo=0, hi=2)
    p.mirostat_tau = _field(body, ("mirostat_tau",), p.mirostat_tau)
    p.mirostat_eta = _field(body, ("mirostat_eta",), p.mirostat_eta)
    p.adaptive_target = _field(body, ("adaptive_target",), p.adaptive_target, lo=FLT_LOWEST, hi=1.0)
    p.adaptive_decay = _field(body, ("adaptive_decay",), p.adaptive_decay, lo=0.0, hi=0.99, hard=True)
    if _has(body, "seed"):
        p.seed = _num("seed", body["seed"], int) & 0xFFFFFFFF  # get<uint32_t>: -1 is LLAMA_DEFAULT_SEED
    p.n_probs = _field(body, ("n_probs", "logprobs"), p.n_probs, kind=int)
    p.min_keep = _field(body, ("min_keep",), p.min_keep, kind=int, lo=0, hi=INT32_MAX, hard=True)
    if _has(body, "post_sampling_probs"):
        p.post_sampling_probs = bool(body["post_sampling_probs"])
    if _has(body, "dry_sequence_breakers"):
        brk = body["dry_sequence_breakers"]
        if not isinstance(brk, list) or not all(isinstance(b, str) for b in brk) or not brk:
            raise ValueError("Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array "
                             "of strings")
        p.dry_sequence_breakers = tuple(brk)
    # "json_schema" (alias "grammar"): json_schema wins only when no grammar is given
    if _has(body, "json_schema") or _has(body, "grammar"):
        if "json_schema" in body and "grammar" not in body:
            p.grammar = json_schema_grammar(body["json_schema"])
        else:
            g = body.get("grammar")
            if g is not None and not isinstance(g, str):
                raise ValueError(f"Field 'grammar': [json.exception.type_error.302] type must be string, but is "
                                 f"{_type_name(g)}")
            p.grammar = g or ""
    if _has(body, "logit_bias"):
        p.logit_bias = _logit_bias(model, body["logit_bias"])
    if _has(body, "ignore_eos"):
        p.ignore_eos = bool(body["ignore_eos"])  # its EOG biases go after the user's (the llama layer adds them)
    if _has(body, "samplers"):
        s = body["samplers"]
        if isinstance(s, list):
            p.samplers = samplers_from_names([x for x in s if isinstance(x, str)])
        elif isinstance(s, str):
            p.samplers = samplers_from_chars(s)
    return p


def chat_fields(body: dict) -> dict:
    """`oaicompat_chat_params_parse` for the sampling fields: returns the body to read (a copy)."""
    body = dict(body)
    json_schema = body.get("json_schema")
    grammar = body.get("grammar") or ""
    if json_schema is not None and grammar:
        raise ValueError("Cannot use both json_schema and grammar")
    if "response_format" in body:
        rf = body.get("response_format")
        rf = rf if isinstance(rf, dict) else {}
        rtype = rf.get("type") or ""
        if rtype == "json_object":
            if "schema" in rf or not json_schema:
                json_schema = rf.get("schema", {})
        elif rtype == "json_schema":
            wrapper = rf.get("json_schema") or {}
            json_schema = wrapper.get("schema", {}) if isinstance(wrapper, dict) else {}
        elif rtype and rtype != "text":
            raise ValueError(f"response_format type must be one of \"text\" or \"json_object\", but got: {rtype}")
    if isinstance(json_schema, dict) and not json_schema and ("json_schema" in body or "response_format" in body):
        json_schema = {"type": "object"}
    if json_schema is not None:
        if not isinstance(json_schema, dict):
            json_schema_grammar(json_schema)  # the converter's "schema must be an object"
        from slotlab.serve.json_schema import SchemaError, check

        try:  # the chat template's parser is built from the schema first: its words
            check(json_schema)
        except SchemaError as ex:
            raise ValueError("Unable to generate parser for this template. Automatic parser generation failed: "
                             f"{ex}") from None
        # the chat template turns the schema into a grammar over the reply
        body["grammar"] = json_schema_grammar(json_schema)
        body.pop("json_schema", None)
    if body.get("logprobs") is True:
        body["n_probs"] = body.get("top_logprobs", 20)
        if body["n_probs"] is None:
            body["n_probs"] = 20
    elif body.get("top_logprobs") is not None:
        raise ValueError("top_logprobs requires logprobs to be set to true")
    return body


# ------------------------------------------------------------------------------------------- output


def _valid_utf8_len(b: bytes) -> int:
    """validate_utf8: the length without a multi-byte character cut off at the end."""
    n = len(b)
    for i in range(1, min(4, n) + 1):
        c = b[n - i]
        if (c & 0xE0) == 0xC0 and i < 2 or (c & 0xF0) == 0xE0 and i < 3 or (c & 0xF8) == 0xF0 and i < 4:
            return n - i
    return n


def _text(piece: bytes) -> str:
    return piece[:_valid_utf8_len(piece)].decode("utf-8", errors="replace")


def _logarithm(x: float) -> float:
    """completion_token_output::logarithm: log of a float, and lowest() for 0 (JSON has no -inf)."""
    import numpy as np

    return FLT_LOWEST if x == 0.0 else float(np.log(np.float32(x)))


def probs_json(model, token_probs: list, post_sampling: bool) -> list[dict]:
    """probs_vector_to_json: per token id / token / bytes / (log)prob and the top candidates. Pieces
    are rendered without special tokens (params_base.special is off)."""
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def val(p: float) -> float:
        return p if post_sampling else _logarithm(p)

    out = []
    for tp in token_probs:
        piece = model.token_to_piece(tp.token, special=False)
        top = []
        for tid, p in tp.top:
            pc = model.token_to_piece(tid, special=False)
            top.append({"id": tid, "token": _text(pc), "bytes": list(pc), key: val(p)})
        out.append({"id": tp.token, "token": _text(piece), "bytes": list(piece), key: val(tp.prob), top_key: top})
    return out


def probs_for_result(model, task, *, stream: bool) -> list:
    """The final response's probs_output: all of them, less the stop word's tokens when a
    non-streamed generation stopped on a word."""
    probs = list(task.token_probs)
    r = task.result or {}
    if not stream and r.get("stop_type") == "word" and probs:
        word = stopping_word(model, task)
        n = len(model.tokenize(word, add_special=False, parse_special=False)) if word else 0
        probs = probs[:len(probs) - min(len(probs), n)]
    return probs


def stopping_word(model, task) -> str:
    """The stop string that ended the generation (the first one found in the text)."""
    text = model.detokenize((task.result or {}).get("tokens", []))
    hits = [(text.find(w), w) for w in task.params.stop or () if w and w in text]
    return min(hits)[1] if hits else ""


def n_cmpl(body: dict, n_parallel: int) -> int:
    """`n_cmpl` (alias `n`): hard limits 1 .. n_parallel."""
    return _field(body, ("n_cmpl", "n"), 1, kind=int, lo=1, hi=n_parallel, hard=True)


def child_body(body: dict, j: int) -> dict:
    """The request of choice j: `add_child` gives child j the seed + j (unless the seed is random)."""
    if j == 0 or not _has(body, "seed"):
        return body
    seed = _num("seed", body["seed"], int) & 0xFFFFFFFF
    return body if seed == 0xFFFFFFFF else dict(body, seed=(seed + j) & 0xFFFFFFFF)
