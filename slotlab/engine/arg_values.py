"""How llama-server turns a flag's text into a value: the C library conversions its argument parser
calls (std::stoi, std::stof, std::stoul), its truthy / falsey words, and the fixed choices of the
options whose help lists them. Emulated exactly so a value the server accepts parses here to the same
number, and a value it refuses is a ConfigError here too (a Python int() would refuse "4096 " and
accept "0x10" where the server does the opposite)."""

from __future__ import annotations

import math
import re
import struct

INT32 = (-2**31, 2**31 - 1)

TRUTHY = ("on", "enabled", "true", "1")  # common_arg_utils::is_truthy
FALSEY = ("off", "disabled", "false", "0")  # is_falsey
AUTOY = ("auto", "-1")  # is_autoy

# ggml type names the KV cache flags accept (arg.cpp kv_cache_types)
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

_INT = re.compile(r"[ \t\n\v\f\r]*([-+]?\d+)")
_FLOAT = re.compile(r"[ \t\n\v\f\r]*([-+]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][-+]?\d+)?"
                    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?))", re.I)


class BadValue(ValueError):
    """The server's conversion refuses the text (std::invalid_argument / std::out_of_range)."""


def stoi(s: str) -> int:
    """std::stoi: leading blanks, a sign, base-10 digits; trailing text ignored; int32 range."""
    m = _INT.match(s)
    if not m:
        raise BadValue("stoi")
    v = int(m.group(1))
    if not INT32[0] <= v <= INT32[1]:
        raise BadValue("stoi: out of range")
    return v


def stoul(s: str, bits: int = 32) -> int:
    """std::stoul stored in a uint32_t (the seed): a leading '-' negates modulo 2**64, as strtoul does,
    so "-1" is 4294967295 (LLAMA_DEFAULT_SEED)."""
    m = _INT.match(s)
    if not m:
        raise BadValue("stoul")
    v = int(m.group(1))
    if abs(v) >= 2**64:
        raise BadValue("stoul: out of range")
    return (v % 2**64) % 2**bits


def stof(s: str) -> float:
    """std::stof: strtof's longest float prefix (decimal, hex, inf, nan), rounded to float32."""
    m = _FLOAT.match(s)
    if not m:
        raise BadValue("stof")
    t = m.group(1).lower()
    if "nan" in t:
        v = math.nan
    elif "inf" in t:
        v = -math.inf if t.startswith("-") else math.inf
    elif "0x" in t:
        v = float.fromhex(t)
    else:
        v = float(t)
    if math.isfinite(v):
        try:
            v = f32(v)
        except OverflowError:
            raise BadValue("stof: out of range") from None
    return v


def f32(v: float) -> float:
    """The float32 nearest to v, as a Python float (what the server stores and later prints)."""
    return struct.unpack("f", struct.pack("f", v))[0]


def bool_value(s: str) -> bool:
    """parse_bool_value, used for a switch's environment variable."""
    if s in TRUTHY:
        return True
    if s in FALSEY:
        return False
    raise BadValue("invalid boolean value")


def check_choice(names, choices, value: str) -> None:
    """Refuse what the server's handler refuses for options with a fixed set of values: `choices`
    from the argument table, and the KV cache types (checked by kv_cache_type_from_str)."""
    if any(n.startswith(("--cache-type-", "--spec-draft-type-")) for n in names):
        choices = KV_CACHE_TYPES
    if choices is not None and value not in choices:
        raise BadValue(f"unknown value {value!r} (one of: {', '.join(c for c in choices if c)})")
