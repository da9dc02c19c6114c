"""The checks of llama.cpp's JSON-schema reader (common/json-schema.cpp, common_chat_schema_builder),
without the grammar it builds: which schemas the server refuses and its words for them
(`JSON schema error at #/properties/a: unrecognized type nope`).

slotlab turns a schema into a grammar with llama-cpp-python's Python port of the converter, whose
errors are its own (`Unrecognized schema: {'a': 1}`); running these checks first gives a refused
schema the server's text. Where the C++ reader accepts what the Python port refuses (a node with
no keyword either knows, which the C++ reads as any value), slotlab's answer is the port's,
documented in docs/server-behaviour.md 10.3."""

from __future__ import annotations


class SchemaError(ValueError):
    """`JSON schema error at PATH: MSG`."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"JSON schema error at {path}: {msg}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check(root) -> None:
    """Raise SchemaError where common_chat_schema_builder fails."""
    seen: set[str] = set()

    def count(s, key, path):
        if key in s and (not _is_int(s[key]) or s[key] < 0):
            raise SchemaError(path, f"{key} must be a non-negative integer")

    def bound(s, key, path):
        if not _is_num(s[key]):
            raise SchemaError(path, f"{key} must be a number")

    def fmt(s, path) -> bool:
        if "format" not in s:
            return False
        f = s["format"]
        if not isinstance(f, str):
            raise SchemaError(path, "format must be a string")
        return f in ("date", "time", "date-time", "uuid") or (len(f) == 5 and f[:4] == "uuid" and "1" <= f[4] <= "5")

    def ref(value, path):
        if not isinstance(value, str):
            raise SchemaError(path, "$ref must be a string")
        if not value.startswith("#/"):
            raise SchemaError(path, f"unsupported $ref {value}, only references into the same document are supported")
        if value in seen:
            return
        seen.add(value)
        target = root
        for sel in value[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                try:
                    idx = int(sel) if sel.strip().lstrip("+").isdigit() else len(target)
                except ValueError:
                    idx = len(target)
                if idx >= len(target):
                    raise SchemaError(path, f"cannot resolve $ref {value}, {sel} is out of range")
                target = target[idx]
            else:
                raise SchemaError(path, f"cannot resolve $ref {value}, {sel} not found")
        node(target, value)

    def alternatives(alts, path):
        if not isinstance(alts, list):
            raise SchemaError(path, "must be an array of schemas")
        if not alts:
            raise SchemaError(path, "must not be empty")
        for i, a in enumerate(alts):
            node(a, f"{path}/{i}")

    def obj(s, path):
        if "properties" in s:
            props = s["properties"]
            if not isinstance(props, dict):
                raise SchemaError(path, "properties must be an object")
            for name, p in props.items():
                node(p, f"{path}/properties/{name}")
        if "additionalProperties" in s:
            a = s["additionalProperties"]
            if isinstance(a, dict):
                node(a, f"{path}/additionalProperties")
            elif not isinstance(a, bool):
                raise SchemaError(path, "additionalProperties must be a boolean or a schema")

    def arr(s, path):
        if "items" in s or "prefixItems" in s:
            key = "items" if "items" in s else "prefixItems"
            items = s[key]
            if isinstance(items, list):
                for i, it in enumerate(items):
                    node(it, f"{path}/{key}/{i}")
                return
            node(items, f"{path}/{key}")
        count(s, "minItems", path)
        count(s, "maxItems", path)

    def string(s, path):
        if "pattern" in s and not isinstance(s["pattern"], str):
            raise SchemaError(path, "pattern must be a string")
        fmt(s, path)
        count(s, "minLength", path)
        count(s, "maxLength", path)

    def integer(s, path):
        for lo, hi in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if lo in s:
                bound(s, lo, path)
            elif hi in s:
                bound(s, hi, path)

    def node(s, path):
        if not isinstance(s, dict):
            raise SchemaError(path, "schema must be an object")
        if "$ref" in s:
            return ref(s["$ref"], path)
        if "oneOf" in s or "anyOf" in s:
            key = "oneOf" if "oneOf" in s else "anyOf"
            return alternatives(s[key], f"{path}/{key}")
        t = s.get("type")
        if isinstance(t, list):
            if not t:
                raise SchemaError(path, "type must not be empty")
            for i, x in enumerate(t):
                node({**s, "type": x}, f"{path}/type/{i}")
            return
        if "const" in s:
            return
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise SchemaError(path, "enum must be a non-empty array")
            return
        if t is not None and not isinstance(t, str):
            raise SchemaError(path, "type must be a string or an array of strings")
        name = t or ""
        has_props = "properties" in s or ("additionalProperties" in s and s["additionalProperties"] is not True)
        if not name:
            if has_props:
                return obj(s, path)
            if "allOf" in s:
                return alternatives(s["allOf"], f"{path}/allOf")
            if "items" in s or "prefixItems" in s:
                return arr(s, path)
            if "pattern" in s or "minLength" in s or "maxLength" in s or fmt(s, path):
                return string(s, path)
            return
        if name == "object":
            if not has_props and "allOf" in s:
                return alternatives(s["allOf"], f"{path}/allOf")
            return obj(s, path)
        if name == "string":
            if "allOf" in s:
                return alternatives(s["allOf"], f"{path}/allOf")
            return string(s, path)
        if name == "array":
            return arr(s, path)
        if name == "integer":
            return integer(s, path)
        if name in ("number", "boolean", "null"):
            return
        raise SchemaError(path, f"unrecognized type {name}")

    node(root, "#")
