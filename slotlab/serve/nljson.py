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
import re

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
    return json.dumps(finite(obj), ensure_ascii=False, separators=(",", ":"))


def finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


# ------------------------------------------------------------------------------------ json::parse


class _Slow(Exception):
    """The fast path met something nlohmann judges differently (a number out of range, NaN)."""


def _fast_int(s: str):
    if len(s) <= 21:
        v = int(s)
        if INT64_MIN <= v < 2**64:
            return v
    raise _Slow  # nlohmann reads it as a double (and refuses it if that overflows)


def _fast_float(s: str):
    v = float(s)
    if not math.isfinite(v):
        raise _Slow
    return v


def _fast_constant(name: str):
    raise _Slow


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse(raw: bytes | str):
    """json::parse(body): the value, or the JsonError the server answers with.

    A body Python reads exactly as nlohmann does takes the fast path (json.loads); anything else (bad
    JSON, invalid UTF-8, a BOM, NaN, a number that overflows or does not fit 64 bits, a surrogate
    escape, deep nesting, a NUL after the value) is read by `_Parser`, a port of nlohmann's lexer and
    its iterative SAX parser over the body's bytes, so the value, the error text and its byte column
    are the server's."""
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else bytes(raw)
    if not _SURROGATE_ESCAPE.search(data):
        try:
            text = data.decode("utf-8")
            if not text.startswith("\ufeff"):
                return json.loads(text, parse_int=_fast_int, parse_float=_fast_float,
                                  parse_constant=_fast_constant)
        except (ValueError, RecursionError, _Slow):
            pass
    return _Parser(data).parse()


_NAMES = {"str": "string literal", "num": "number literal", "true": "true literal", "false": "false literal",
          "null": "null literal", "[": "'['", "{": "'{'", "]": "']'", "}": "'}'", ":": "':'", ",": "','",
          "err": "<parse error>", "eof": "end of input", "value": "'[', '{', or a literal"}
# the lexer's names of the control characters (its "must be escaped" messages)
_CTRL_NAMES = ("NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI DLE DC1 DC2 DC3 DC4 NAK SYN ETB "
               "CAN EM SUB ESC FS GS RS US").split()
_CTRL_SHORT = {0x08: "b", 0x09: "t", 0x0A: "n", 0x0C: "f", 0x0D: "r"}
_ESCAPES = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x62: "\b", 0x66: "\f", 0x6E: "\n", 0x72: "\r", 0x74: "\t"}
# UTF-8 lead bytes and the ranges of the bytes that must follow (scan_string)
_UTF8 = {}
for _b in range(0xC2, 0xE0):
    _UTF8[_b] = ((0x80, 0xBF),)
_UTF8[0xE0] = ((0xA0, 0xBF), (0x80, 0xBF))
for _b in [*range(0xE1, 0xED), 0xEE, 0xEF]:
    _UTF8[_b] = ((0x80, 0xBF), (0x80, 0xBF))
_UTF8[0xED] = ((0x80, 0x9F), (0x80, 0xBF))
_UTF8[0xF0] = ((0x90, 0xBF), (0x80, 0xBF), (0x80, 0xBF))
for _b in (0xF1, 0xF2, 0xF3):
    _UTF8[_b] = ((0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF))
_UTF8[0xF4] = ((0x80, 0x8F), (0x80, 0xBF), (0x80, 0xBF))
EOF_ = -1


class _Parser:
    """nlohmann's lexer (positions in bytes, its `token_string` for "last read") and
    `sax_parse_internal` (a loop with a stack, so nesting depth is bounded by memory only, as in the
    server), building the value as the DOM parser does (a repeated key: the last value wins)."""

    def __init__(self, data: bytes):
        self.s = data
        self.n = len(data)
        self.i = 0  # next byte to read
        self.cur = EOF_
        self.next_unget = False
        self.total = 0  # chars_read_total
        self.col = 0  # chars_read_current_line
        self.lines = 0
        self.tok = bytearray()  # token_string
        self.buf = bytearray()  # token_buffer (a string's decoded bytes)
        self.err = ""
        self.value = None  # the last scanned literal's value

    # -- input management
    def get(self) -> int:
        self.total += 1
        self.col += 1
        if self.next_unget:
            self.next_unget = False
        else:
            if self.i < self.n:
                self.cur = self.s[self.i]
                self.i += 1
            else:
                self.cur = EOF_
        if self.cur != EOF_:
            self.tok.append(self.cur)
        if self.cur == 0x0A:
            self.lines += 1
            self.col = 0
        return self.cur

    def unget(self) -> None:
        self.next_unget = True
        self.total -= 1
        if self.col == 0:
            if self.lines > 0:
                self.lines -= 1
        else:
            self.col -= 1
        if self.cur != EOF_:
            self.tok.pop()

    def reset(self) -> None:
        self.buf = bytearray()
        self.tok = bytearray([self.cur]) if self.cur != EOF_ else bytearray()

    def token_string(self) -> str:
        out = bytearray()
        for c in self.tok:
            out += f"<U+{c:04X}>".encode() if c <= 0x1F else bytes([c])
        return out.decode("utf-8", "replace")  # safe_json_to_str: invalid UTF-8 replaced

    # -- the scanner
    def scan(self) -> str:
        if self.total == 0:  # skip_bom
            if self.get() == 0xEF:
                if not (self.get() == 0xBB and self.get() == 0xBF):
                    self.err = "invalid BOM; must be 0xEF 0xBB 0xBF if given"
                    return "err"
            else:
                self.unget()
        while True:
            c = self.get()
            if c not in (0x20, 0x09, 0x0A, 0x0D):
                break
        if c in (0x5B, 0x5D, 0x7B, 0x7D, 0x3A, 0x2C):
            return chr(c)
        if c == 0x74:
            return self.literal(b"true", "true", True)
        if c == 0x66:
            return self.literal(b"false", "false", False)
        if c == 0x6E:
            return self.literal(b"null", "null", None)
        if c == 0x22:
            return self.scan_string()
        if c == 0x2D or 0x30 <= c <= 0x39:
            return self.scan_number()
        if c in (0, EOF_):
            return "eof"
        self.err = "invalid literal"
        return "err"

    def literal(self, text: bytes, tok: str, value) -> str:
        for ch in text[1:]:
            if self.get() != ch:
                self.err = "invalid literal"
                return "err"
        self.value = value
        return tok

    def _codepoint(self) -> int:
        cp = 0
        for factor in (12, 8, 4, 0):
            c = self.get()
            if 0x30 <= c <= 0x39:
                cp += (c - 0x30) << factor
            elif 0x41 <= c <= 0x46:
                cp += (c - 0x37) << factor
            elif 0x61 <= c <= 0x66:
                cp += (c - 0x57) << factor
            else:
                return -1
        return cp

    def scan_string(self) -> str:
        self.reset()
        buf = self.buf
        while True:
            c = self.get()
            if c == EOF_:
                self.err = "invalid string: missing closing quote"
                return "err"
            if c == 0x22:
                self.value = buf.decode("utf-8")
                return "str"
            if c == 0x5C:
                e = self.get()
                if e in _ESCAPES:
                    buf += _ESCAPES[e].encode()
                    continue
                if e != 0x75:
                    self.err = "invalid string: forbidden character after backslash"
                    return "err"
                cp = self._codepoint()
                if cp == -1:
                    self.err = "invalid string: '\\u' must be followed by 4 hex digits"
                    return "err"
                if 0xD800 <= cp <= 0xDBFF:
                    if self.get() == 0x5C and self.get() == 0x75:
                        cp2 = self._codepoint()
                        if cp2 == -1:
                            self.err = "invalid string: '\\u' must be followed by 4 hex digits"
                            return "err"
                        if not 0xDC00 <= cp2 <= 0xDFFF:
                            self.err = "invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"
                            return "err"
                        cp = (cp << 10) + cp2 - 0x35FDC00
                    else:
                        self.err = "invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"
                        return "err"
                elif 0xDC00 <= cp <= 0xDFFF:
                    self.err = "invalid string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"
                    return "err"
                buf += chr(cp).encode("utf-8")
                continue
            if c <= 0x1F:
                short = _CTRL_SHORT.get(c)
                self.err = (f"invalid string: control character U+{c:04X} ({_CTRL_NAMES[c]}) must be escaped to "
                            f"\\u{c:04X}" + (f" or \\{short}" if short else ""))
                return "err"
            if c <= 0x7F:
                buf.append(c)
                continue
            ranges = _UTF8.get(c)
            if ranges is None:
                self.err = "invalid string: ill-formed UTF-8 byte"
                return "err"
            buf.append(c)
            for lo, hi in ranges:
                c2 = self.get()
                if lo <= c2 <= hi:
                    buf.append(c2)
                else:
                    self.err = "invalid string: ill-formed UTF-8 byte"
                    return "err"

    def scan_number(self) -> str:
        self.reset()
        digit = lambda ch: 0x30 <= ch <= 0x39  # noqa: E731
        kind = "unsigned"
        c = self.cur
        if c == 0x2D:
            kind = "integer"
            c = self.get()
            if not digit(c):
                self.err = "invalid number; expected digit after '-'"
                return "err"
        if c == 0x30:
            c = self.get()
        else:
            while digit(c := self.get()):
                pass
        if c == 0x2E:
            kind = "float"
            if not digit(self.get()):
                self.err = "invalid number; expected digit after '.'"
                return "err"
            while digit(c := self.get()):
                pass
        if c in (0x65, 0x45):
            kind = "float"
            c = self.get()
            if c in (0x2B, 0x2D):
                if not digit(self.get()):
                    self.err = "invalid number; expected digit after exponent sign"
                    return "err"
            elif not digit(c):
                self.err = "invalid number; expected '+', '-', or digit after exponent"
                return "err"
            while digit(self.get()):
                pass
        self.unget()
        text = bytes(self.tok).decode("ascii")
        if kind == "unsigned" and len(text) <= 20 and int(text) < 2**64:
            self.value = int(text)
        elif kind == "integer" and len(text) <= 20 and int(text) >= INT64_MIN:
            self.value = int(text)
        else:
            self.value = float(text)  # strtod: an overflow is inf, refused by the parser (406)
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
        raise JsonError("parse_error", 101, f"parse error at line {self.lines + 1}, column {self.col}: {msg}")

    def scalar(self, tok: str):
        """A value token's value; raises for anything else (sax_parse_internal's switch)."""
        if tok == "num":
            v = self.value
            if isinstance(v, float) and not math.isfinite(v):
                raise JsonError("out_of_range", 406, f"number overflow parsing '{self.token_string()}'")
            return v
        if tok in ("str", "true", "false", "null"):
            return self.value
        if tok == "err":
            self.fail(tok, None, "value")
        if tok == "eof" and self.total == 1:
            raise JsonError("parse_error", 101, "parse error at line 1, column 1: attempting to parse an empty "
                                                "input; check that your input string or stream contains the expected JSON")
        self.fail(tok, "value", "value")

    def parse(self):
        root: list = []
        stack: list = []  # [container, key]: the open arrays and objects
        tok = self.scan()

        def add(v):
            if not stack:
                root.append(v)
            elif isinstance(stack[-1][0], list):
                stack[-1][0].append(v)
            else:
                stack[-1][0][stack[-1][1]] = v

        while True:
            # a value starts with `tok`
            if tok == "{":
                tok = self.scan()
                if tok == "}":
                    add({})
                else:
                    if tok != "str":
                        self.fail(tok, "str", "object key")
                    key = self.value
                    tok = self.scan()
                    if tok != ":":
                        self.fail(tok, ":", "object separator")
                    obj: dict = {}
                    add(obj)
                    stack.append([obj, key])
                    tok = self.scan()
                    continue
            elif tok == "[":
                tok = self.scan()
                if tok == "]":
                    add([])
                else:
                    arr: list = []
                    add(arr)
                    stack.append([arr, None])
                    continue
            else:
                add(self.scalar(tok))
            # after a value: close containers or go to the next element
            while True:
                if not stack:
                    tok = self.scan()
                    if tok != "eof":
                        self.fail(tok, "eof", "value")
                    return root[0]
                top = stack[-1]
                tok = self.scan()
                if isinstance(top[0], list):
                    if tok == ",":
                        tok = self.scan()
                        break
                    if tok == "]":
                        stack.pop()
                        continue
                    self.fail(tok, "]", "array")
                if tok == ",":
                    tok = self.scan()
                    if tok != "str":
                        self.fail(tok, "str", "object key")
                    top[1] = self.value
                    tok = self.scan()
                    if tok != ":":
                        self.fail(tok, ":", "object separator")
                    tok = self.scan()
                    break
                if tok == "}":
                    stack.pop()
                    continue
                self.fail(tok, "}", "object")
