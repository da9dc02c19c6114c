"""JSON as llama-server's nlohmann::json reads it: the body parse with nlohmann's parse-error texts,
and `get<T>()` with its conversions and type errors.

The server answers bad JSON and wrong types with nlohmann's exception text (`[json.exception.
parse_error.101] parse error at line 1, column 30: syntax error while parsing value - invalid
literal; last read: '"temperature":N'`), so a client sees the same text from slotlab. A number read
into an int32 field is C++'s `static_cast`: integers wrap modulo 2^32, a double out of range becomes
INT32_MIN (x86's cvttsd2si), so `"n_predict": 1e30` is refused as -2147483648, as the server does."""

from __future__ import annotations

import json
import math

import numpy as np

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
UINT32_MAX = 2**32 - 1
FLT_MAX = float(np.finfo(np.float32).max)


class JsonError(Exception):
    """A nlohmann::json exception: `[json.exception.<kind>.<id>] <message>`."""

    def __init__(self, kind: str, id_: int, message: str):
        super().__init__(f"[json.exception.{kind}.{id_}] {message}")


def type_name(v) -> str:
    """basic_json::type_name()."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "number"


def _stored(v):
    """nlohmann keeps integers in [-2^63, 2^64) as integers and parses anything bigger as a double."""
    if isinstance(v, int) and not isinstance(v, bool) and not (INT64_MIN <= v < 2**64):
        return float(v)
    return v


def _type_error(what: str, v) -> JsonError:
    return JsonError("type_error", 302, f"type must be {what}, but is {type_name(v)}")


def get_int(v, bits: int = 32, signed: bool = True) -> int:
    """get<intN_t / uintN_t>(): booleans and numbers convert as static_cast does on x86-64."""
    v = _stored(v)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        x = v % 2**bits
        return x - 2**bits if signed and x >= 2**(bits - 1) else x
    if isinstance(v, float):
        if bits == 32 and not signed:  # via a 64-bit conversion, then truncated
            return 0 if not math.isfinite(v) or abs(v) >= 2**63 else int(v) % 2**32
        lo, hi = -2**(bits - 1), 2**(bits - 1)
        if not math.isfinite(v) or not (lo - 1 < v < hi):
            return lo  # the "integer indefinite" value
        return int(v)
    raise _type_error("number", v)


def get_float(v) -> float:
    """get<float>(): a float32 value (as a Python float; out of range is +-inf)."""
    v = _stored(v)
    if isinstance(v, (bool, int, float)):
        with np.errstate(over="ignore"):
            return float(np.float32(float(v)))
    raise _type_error("number", v)


def get_bool(v) -> bool:
    if isinstance(v, bool):
        return v
    raise _type_error("boolean", v)


def get_str(v) -> str:
    if isinstance(v, str):
        return v
    raise _type_error("string", v)


def at(obj, key: str):
    """basic_json::at(key): a missing key or a non-object is an exception."""
    if not isinstance(obj, dict):
        raise JsonError("type_error", 304, f"cannot use at() with {type_name(obj)}")
    if key not in obj:
        raise JsonError("out_of_range", 403, f"key '{key}' not found")
    return obj[key]


def items(v) -> list:
    """Range-for over a json value: an array's elements, an object's values, nothing for null, else
    the value itself."""
    if isinstance(v, list):
        return v
    if isinstance(v, dict):
        return list(v.values())
    return [] if v is None else [v]


def json_value(body, key: str, default, conv=None):
    """server-common.h json_value(): null or absent is the default, and so is a value of the wrong
    type (the server logs a warning and goes on)."""
    if not isinstance(body, dict) or body.get(key) is None:
        return default
    if conv is None:
        return body[key]
    try:
        return conv(body[key])
    except JsonError:
        return default


def dumps(obj) -> str:
    """nlohmann's dump of an answer: non-finite floats are null."""
    return json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"))


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------ json::parse


def _no_constant(name: str):
    raise ValueError(name)


def parse(raw: bytes | str):
    """json::parse(body): the value, or the JsonError the server answers with. Valid JSON takes the
    fast path; only a body Python refuses (or NaN / Infinity, which nlohmann refuses) is walked by
    `_Checker` for nlohmann's exact text."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        pass
    _Checker(text).run()
    raise JsonError("parse_error", 101, "parse error: invalid JSON")  # not reached for the cases above


_NAMES = {"str": "string literal", "num": "number literal", "true": "true literal", "false": "false literal",
          "null": "null literal", "[": "'['", "{": "'{'", "]": "']'", "}": "'}'", ":": "':'", ",": "','",
          "err": "<parse error>", "eof": "end of input", "value": "'[', '{', or a literal"}
_CTRL = {0x08: "BS", 0x09: "TAB", 0x0A: "LF", 0x0C: "FF", 0x0D: "CR"}


class _Checker:
    """nlohmann's lexer and SAX parser, reduced to finding the first error and its position."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0  # chars read
        self.col = 0
        self.line = 0
        self.cur = ""
        self.tok_str: list[str] = []
        self.err = ""

    def get(self) -> str:
        self.col += 1
        if self.i < len(self.s):
            c = self.s[self.i]
            self.tok_str.append(c)
            if c == "\n":
                self.line += 1
                self.col = 0
        else:
            c = ""
        self.i += 1
        self.cur = c
        return c

    def unget(self) -> None:
        self.i -= 1
        if self.col == 0 and self.line > 0:
            self.line -= 1
        else:
            self.col -= 1
        if self.cur:
            self.tok_str.pop()
        self.cur = self.s[self.i - 1] if 0 < self.i <= len(self.s) else ""

    def reset(self) -> None:
        self.tok_str = [self.cur]

    def token_string(self) -> str:
        return "".join(f"<U+{ord(c):04X}>" if ord(c) <= 0x1F else c for c in self.tok_str)

    def scan(self) -> str:
        while True:
            c = self.get()
            if c not in (" ", "\t", "\n", "\r"):
                break
        if c in "[]{}:," and c:
            return c
        for lit in ("true", "false", "null"):
            if c == lit[0]:
                for ch in lit[1:]:
                    if self.get() != ch:
                        self.err = "invalid literal"
                        return "err"
                return lit
        if c == '"':
            return self.scan_string()
        if c == "-" or c.isdigit() and c.isascii():
            return self.scan_number()
        if c == "" or c == "\0":
            return "eof"
        self.err = "invalid literal"
        return "err"

    def scan_string(self) -> str:
        self.reset()
        while True:
            c = self.get()
            if c == "":
                self.err = "invalid string: missing closing quote"
                return "err"
            if c == '"':
                return "str"
            if c == "\\":
                e = self.get()
                if e == "u":
                    for _ in range(4):
                        if self.get().lower() not in "0123456789abcdef" or self.cur == "":
                            self.err = "invalid string: '\\u' must be followed by 4 hex digits"
                            return "err"
                elif e not in ('"', "\\", "/", "b", "f", "n", "r", "t"):
                    self.err = "invalid string: forbidden character after backslash"
                    return "err"
            elif ord(c) <= 0x1F:
                esc = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}.get(ord(c))
                name = _CTRL.get(ord(c))
                self.err = (f"invalid string: control character U+{ord(c):04X} ({name}) must be escaped to "
                            f"\\u{ord(c):04X} or \\{esc}" if esc else
                            f"invalid string: control character U+{ord(c):04X} must be escaped to \\u{ord(c):04X}")
                return "err"

    def scan_number(self) -> str:
        self.reset()
        c = self.cur
        digit = lambda ch: ch != "" and ch in "0123456789"  # noqa: E731
        if c == "-":
            c = self.get()
            if not digit(c):
                self.err = "invalid number; expected digit after '-'"
                return "err"
        if c == "0":
            c = self.get()
        else:
            while digit(c := self.get()):
                pass
        if c == ".":
            if not digit(self.get()):
                self.err = "invalid number; expected digit after '.'"
                return "err"
            while digit(c := self.get()):
                pass
        if c in ("e", "E") and c:
            c = self.get()
            if c in ("+", "-") and c:
                if not digit(self.get()):
                    self.err = "invalid number; expected digit after exponent sign"
                    return "err"
            elif not digit(c):
                self.err = "invalid number; expected '+', '-', or digit after exponent"
                return "err"
            while digit(self.get()):
                pass
        self.unget()
        text = "".join(self.tok_str)
        if any(ch in text for ch in ".eE") and not math.isfinite(float(text)):
            raise JsonError("out_of_range", 406, f"number overflow parsing '{text}'")
        return "num"

    # -- the parser

    def fail(self, tok: str, expected: str | None, context: str):
        msg = "syntax error " + (f"while parsing {context} " if context else "") + "- "
        if tok == "err":
            msg += f"{self.err}; last read: '{self.token_string()}'"
        else:
            msg += f"unexpected {_NAMES[tok]}"
        if expected:
            msg += f"; expected {_NAMES[expected]}"
        raise JsonError("parse_error", 101, f"parse error at line {self.line + 1}, column {self.col}: {msg}")

    def value(self, tok: str) -> None:
        if tok == "{":
            tok = self.scan()
            if tok == "}":
                return
            while True:
                if tok != "str":
                    self.fail(tok, "str", "object key")
                tok = self.scan()
                if tok != ":":
                    self.fail(tok, ":", "object separator")
                self.value(self.scan())
                tok = self.scan()
                if tok == ",":
                    tok = self.scan()
                    continue
                if tok == "}":
                    return
                self.fail(tok, "}", "object")
        if tok == "[":
            tok = self.scan()
            if tok == "]":
                return
            while True:
                self.value(tok)
                tok = self.scan()
                if tok == ",":
                    tok = self.scan()
                    continue
                if tok == "]":
                    return
                self.fail(tok, "]", "array")
        if tok in ("str", "num", "true", "false", "null"):
            return
        if tok == "err":
            self.fail(tok, None, "value")
        if tok == "eof" and self.i == 1:
            raise JsonError("parse_error", 101, "parse error at line 1, column 1: attempting to parse an empty "
                                                "input; check that your input string or stream contains the expected JSON")
        self.fail(tok, "value", "value")

    def run(self) -> None:
        self.value(self.scan())
        tok = self.scan()
        if tok != "eof":
            self.fail(tok, "eof", "value")
