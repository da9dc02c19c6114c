"""The fields of a completion request, read as llama-server reads them (server-schema.cpp,
`make_llama_cmpl_schema` and `eval_llama_cmpl_schema`, SCH:10-560).

Every field of the server's schema is evaluated in the server's order, so a request with several bad
fields is refused for the same first one. A null value is an absent one. Numbers convert as the
server's `get<T>()` does (nljson); soft limits clamp (`"temperature": -3` is 0), hard limits refuse
with the server's text (`Field 'n_predict': Value must be between -1 <= value <= 2147483647, but got
-5`), and a value of the wrong type is `Field 'stream': [json.exception.type_error.302] type must be
boolean, but is string`. Those are `InvalidRequest` (400, invalid_request_error), as the server's
`std::invalid_argument` is.

`evaluate(body, defaults, n_parallel)` returns the request's values keyed by the schema's first name
(`n_predict` for `max_tokens` too, `n_cmpl` for `n`) and a normalized body: the same request with
every schema field converted (C++ wrap-around included) and nulls dropped, which the sampling layer
(slotlab.serve.sampling) then reads without meeting a type it would judge differently."""

from __future__ import annotations

from slotlab.serve import nljson as J
from slotlab.serve.errors import InvalidRequest

I32 = (J.INT32_MIN, J.INT32_MAX)
FLT_LOWEST = -J.FLT_MAX
INF = float("inf")


class _Field:
    def __init__(self, names: str, kind: str, lo=None, hi=None, hard: bool = False, handler=None):
        self.names = names.split()
        self.kind, self.lo, self.hi, self.hard, self.handler = kind, lo, hi, hard, handler

    def convert(self, v):
        if self.kind == "bool":
            return J.get_bool(v)
        if self.kind == "float":
            x = J.get_float(v)
        elif self.kind == "u32":
            x = J.get_int(v, 32, signed=False)
        elif self.kind == "i64":
            if isinstance(v, bool):  # the server's int64 field takes numbers only (t_max_predict_ms: false is refused)
                raise J.JsonError("type_error", 302, "type must be number, but is boolean")
            x = J.get_int(v, 64)
        else:
            x = J.get_int(v, 32)
        lo = J.INT32_MIN if self.lo is None and self.kind == "i32" else self.lo
        hi = self.hi
        if self.hard:
            if x < lo or x > hi:
                s = (lambda y: f"{y:.6f}") if self.kind == "float" else str
                raise InvalidRequest(f"Value must be between {s(lo)} <= value <= {s(hi)}, but got {s(x)}")
            return x
        if hi is not None:
            x = x if x < hi else hi  # std::min(max, x)
        if lo is not None:
            x = x if lo < x else lo  # std::max(min, x)
        return x


def _bool(n):
    return _Field(n, "bool")


def _int(n, lo=None, hi=None, hard=False, kind="i32"):
    return _Field(n, kind, lo, hi, hard)


def _flt(n, lo=None, hi=None, hard=False):
    return _Field(n, "float", lo, hi, hard)


def _custom(n, fn):
    return _Field(n, "custom", handler=fn)


# ---- the custom handlers (each gets the whole body and the defaults; returns the value)

def _response_fields(data, d):
    return J.json_value(data, "response_fields", [], lambda v: [J.get_str(x) for x in _array(v)])


def _array(v):
    if not isinstance(v, list):
        raise J.JsonError("type_error", 302, f"type must be array, but is {J.type_name(v)}")
    return v


def _dry_base(data, d):
    v = J.get_float(data["dry_base"])
    return d.get("dry_base", 1.75) if v < 1.0 else v


def _lora(data, d):
    if not isinstance(data["lora"], list):
        raise RuntimeError("Error: 'lora' must be an array of objects with 'id' and 'scale' fields")
    return data["lora"]


def _dry_breakers(data, d):
    v = J.json_value(data, "dry_sequence_breakers", [], lambda x: [J.get_str(s) for s in _array(x)])
    if not v:
        raise RuntimeError("Error: dry_sequence_breakers must be a non-empty array of strings")
    return v


def _grammar(data, d):
    """json_schema wins only without a grammar; a grammar of the wrong type is no grammar (json_value)."""
    if "json_schema" in data and "grammar" not in data:
        return data["json_schema"]
    return J.json_value(data, "grammar", "", J.get_str)


def _str_field(name):
    return lambda data, d: J.get_str(data[name])


def _strings(name):
    return lambda data, d: [J.get_str(x) for x in J.items(data[name])]


def _end_tags(data, d):
    if "reasoning_budget_end_tags" in data:
        return [J.get_str(x) for x in J.items(data["reasoning_budget_end_tags"])]
    return [J.get_str(data["reasoning_budget_end_tag"])]


def _ignore_eos(data, d):
    return J.get_bool(data["ignore_eos"])


def _stop(data, d):
    """An array: every element that is not json-empty must be a string; a string: itself; anything
    else is ignored. Nothing left: the command line's -r words."""
    stop, out = data["stop"], []
    if isinstance(stop, list):
        for w in stop:
            if w is None or w == [] or w == {}:
                continue  # basic_json::empty()
            out.append(J.get_str(w))
    elif isinstance(stop, str):
        out.append(stop)
    return out or list(d.get("stop", []))


def _samplers(data, d):
    s = data["samplers"]
    if isinstance(s, list):
        return [J.get_str(x) for x in s]
    return s if isinstance(s, str) else d.get("samplers")


def _chat_format(data, d):
    return J.get_int(data["chat_format"])


def _reasoning_format(data, d):
    from slotlab.serve.chat_request import reasoning_format

    return reasoning_format(data["reasoning_format"])


GRAMMAR_TRIGGER_TOKEN = 0  # COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN


def _grammar_triggers(data, d):
    """server_grammar_trigger for each element (a range-for: a scalar is one element): `type` an int,
    `value` a string, `token` an int for a token trigger; a lazy grammar needs one."""
    out = []
    for t in J.items(data["grammar_triggers"]):
        kind = J.get_int(J.at(t, "type"))
        trig = {"type": kind, "value": J.get_str(J.at(t, "value"))}
        if kind == GRAMMAR_TRIGGER_TOKEN:
            trig["token"] = J.get_int(J.at(t, "token"))
        out.append(trig)
    if J.json_value(data, "grammar_lazy", False, J.get_bool) and not out:
        raise RuntimeError("Error: no triggers set for lazy grammar!")
    return out


def _schema(n_parallel: int) -> list[_Field]:
    """make_llama_cmpl_schema, in its order (SCH:10-411)."""
    return [
        _bool("verbose"), _bool("timings_per_token"), _bool("stream"),
        _Field("stream_options", "nested"),
        _bool("cache_prompt"), _bool("return_tokens"), _bool("return_progress"),
        _int("sse_ping_interval", -1, J.INT32_MAX, True),
        _int("n_predict max_completion_tokens max_tokens", -1, J.INT32_MAX, True),
        _int("n_indent", 0, J.INT32_MAX, True),
        _int("n_keep", -1, J.INT32_MAX, True),
        _int("n_discard", 0, J.INT32_MAX, True),
        _int("n_cmpl n", 1, n_parallel, True),
        _int("n_cache_reuse", 0, J.INT32_MAX, True),
        _int("t_max_predict_ms", -1, J.INT64_MAX, True, kind="i64"),
        _custom("response_fields", _response_fields),
        _int("top_k", 0, J.INT32_MAX), _flt("top_p", 0.0, 1.0), _flt("min_p", 0.0, 1.0), _flt("top_n_sigma"),
        _flt("xtc_probability", 0.0, 1.0), _flt("xtc_threshold", 0.0, 1.0), _flt("typical_p"),
        _flt("temperature", 0.0, INF), _flt("dynatemp_range"), _flt("dynatemp_exponent"),
        _int("repeat_last_n", 0, J.INT32_MAX, True), _flt("repeat_penalty"), _flt("frequency_penalty"),
        _flt("presence_penalty"), _flt("dry_multiplier"), _custom("dry_base", _dry_base),
        _int("dry_allowed_length", 0, J.INT32_MAX, True), _int("dry_penalty_last_n", 0, J.INT32_MAX, True),
        _int("mirostat", 0, 2), _flt("mirostat_tau"), _flt("mirostat_eta"),
        _flt("adaptive_target", FLT_LOWEST, 1.0), _flt("adaptive_decay", 0.0, 0.99, True),
        _int("seed", 0, J.UINT32_MAX, kind="u32"),
        _int("n_probs logprobs"), _int("min_keep", 0, J.INT32_MAX, True),
        _bool("backend_sampling"), _bool("post_sampling_probs"),
        _custom("lora", _lora), _custom("dry_sequence_breakers", _dry_breakers),
        _custom("json_schema grammar", _grammar), _bool("grammar_lazy"),
        _custom("chat_format", _chat_format), _custom("reasoning_format", _reasoning_format),
        _custom("generation_prompt", _str_field("generation_prompt")), _bool("parse_tool_calls"),
        _custom("chat_parser", _str_field("chat_parser")), _bool("echo"),
        _custom("preserved_tokens", _strings("preserved_tokens")), _custom("grammar_triggers", _grammar_triggers),
        _bool("reasoning_control"), _int("reasoning_budget_tokens", -1, J.INT32_MAX, True),
        _custom("reasoning_budget_start_tag", _str_field("reasoning_budget_start_tag")),
        _custom("reasoning_budget_end_tags reasoning_budget_end_tag", _end_tags),
        _custom("ignore_eos", _ignore_eos), _custom("stop", _stop), _custom("samplers", _samplers),
    ]


def _has(data: dict, n: str) -> bool:
    return n in data and data[n] is not None


def evaluate(body: dict, defaults: dict, n_parallel: int) -> tuple[dict, dict]:
    """(values, normalized body); raises InvalidRequest with the server's `Field '<name>': ...` text."""
    values = dict(defaults)
    norm = {k: v for k, v in body.items() if v is not None}
    for f in _schema(n_parallel):
        if f.kind == "nested":  # stream_options: only when an object; its fields by their own names
            so = body.get("stream_options")
            if isinstance(so, dict) and _has(so, "include_usage"):
                v = _eval(_bool("include_usage"), so, "include_usage", defaults)
                values["include_usage"] = v
                norm["stream_options"] = {**so, "include_usage": v}
            continue
        for n in f.names:
            if _has(body, n):
                v = _eval(f, body, n, defaults)
                values[f.names[0]] = v
                if f.kind != "custom":
                    norm[n] = v
                elif n == "grammar" and not isinstance(body[n], str):
                    norm.pop(n)  # no grammar, as the server's json_value fallback
                break
    values["max_tokens"] = values.get("n_predict", -1)
    values["id_slot"] = J.json_value(body, "id_slot", -1, J.get_int)
    return values, norm


def _eval(f: _Field, data: dict, n: str, defaults: dict):
    """handle_with_catch: any error of a field becomes invalid_argument `Field '<name>': <what>`."""
    try:
        if f.kind == "custom":
            return f.handler(data, defaults)
        return f.convert(data[n])
    except (J.JsonError, InvalidRequest, RuntimeError, ValueError) as e:
        raise InvalidRequest(f"Field '{n}': {e}") from None
