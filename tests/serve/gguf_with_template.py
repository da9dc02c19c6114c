"""Copy a GGUF with `tokenizer.chat_template` replaced, so the real llama-server can be started on the
default model with another family's chat template (the recorder's need; ~250 MB per copy, so copies
live in a build folder and are deleted after use, never committed).

Only the key/value section changes: the tensor infos are copied byte for byte, and the tensor data
keeps its offsets (they are relative to the data section, which is re-aligned after the new header)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _U32 = 8, 9, 4
KEY = "tokenizer.chat_template"


class _R:
    def __init__(self, f):
        self.f = f

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF file")
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string_raw(self) -> bytes:
        n = self.u64()
        return struct.pack("<Q", n) + self.take(n)

    def value_raw(self, t: int) -> bytes:
        if t in _FIXED:
            return self.take(_FIXED[t])
        if t == _STRING:
            return self.string_raw()
        if t == _ARRAY:
            et, n = self.u32(), self.u64()
            head = struct.pack("<IQ", et, n)
            if et in _FIXED:
                return head + self.take(_FIXED[et] * n)
            return head + b"".join(self.value_raw(et) for _ in range(n))
        raise ValueError(f"unknown GGUF value type {t}")


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write_with_template(src: Path, dst: Path, template: str | None) -> Path:
    """Write `dst`: `src` with its chat template set to `template` (None removes it)."""
    with open(src, "rb") as f:
        r = _R(f)
        if r.take(4) != b"GGUF":
            raise ValueError(f"{src} is not a GGUF file")
        version = r.u32()
        n_tensors, n_kv = r.u64(), r.u64()
        kvs: list[tuple[str, int, bytes]] = []
        alignment = 32
        for _ in range(n_kv):
            key_raw = r.string_raw()
            key = key_raw[8:].decode("utf-8")
            t = r.u32()
            raw = r.value_raw(t)
            if key == "general.alignment" and t == _U32:
                alignment = struct.unpack("<I", raw)[0]
            kvs.append((key, t, raw))
        infos_start = f.tell()
        for _ in range(n_tensors):
            r.string_raw()
            nd = r.u32()
            r.take(8 * nd + 4 + 8)
        infos_end = f.tell()
        f.seek(infos_start)
        infos = f.read(infos_end - infos_start)
        data_start = -(-infos_end // alignment) * alignment
        kvs = [kv for kv in kvs if kv[0] != KEY]
        if template is not None:
            kvs.append((KEY, _STRING, _string(template)))
        head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs))
        head += b"".join(_string(k) + struct.pack("<I", t) + raw for k, t, raw in kvs) + infos
        head += b"\0" * ((-len(head)) % alignment)
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "wb") as out:
            out.write(head)
            f.seek(data_start)
            shutil.copyfileobj(f, out, 1 << 22)
    return dst
