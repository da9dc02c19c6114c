"""Just enough of the GGUF header to refuse a bad file with a clear sentence before llama.cpp sees it.

llama.cpp answers a non-GGUF file or an unknown architecture with a NULL model and a log line; reading
the magic, version and `general.architecture` here lets slotlab say which of those it was."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from slotlab.errors import ModelError

GGUF_MAGIC = b"GGUF"
# gguf_type -> fixed size in bytes (strings = 8, arrays = 9 are variable)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    n_tensors: int
    n_kv: int
    architecture: str | None
    name: str | None


class _Reader:
    def __init__(self, f, path: Path):
        self.f, self.path = f, path

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ModelError(f"{self.path}: truncated GGUF header (file ends inside the metadata)")
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        if n > 1 << 24:
            raise ModelError(f"{self.path}: corrupt GGUF header (a {n}-byte string)")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_value(self, t: int) -> None:
        if t in _FIXED:
            self.take(_FIXED[t])
        elif t == _STRING:
            self.string()
        elif t == _ARRAY:
            et, n = self.u32(), self.u64()
            if et in _FIXED:
                self.f.seek(_FIXED[et] * n, 1)
            else:
                for _ in range(n):
                    self.skip_value(et)
        else:
            raise ModelError(f"{self.path}: corrupt GGUF header (unknown value type {t})")


def read_header(path: str | Path) -> GGUFHeader:
    """Read magic, version, counts, `general.architecture` and `general.name`; raise ModelError if
    the file is missing, unreadable or not GGUF."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}")
    try:
        f = path.open("rb")
    except OSError as e:
        raise ModelError(f"cannot open model file {path}: {e.strerror}") from None
    with f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            shown = magic if magic else b"(empty file)"
            raise ModelError(f"{path} is not a GGUF model file (it starts with {shown!r}, expected b'GGUF')")
        r = _Reader(f, path)
        version = r.u32()
        if version not in (2, 3):
            raise ModelError(f"{path}: unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
        n_tensors, n_kv = r.u64(), r.u64()
        arch = name = None
        for _ in range(n_kv):
            key = r.string()
            t = r.u32()
            if key in ("general.architecture", "general.name") and t == _STRING:
                v = r.string()
                if key == "general.architecture":
                    arch = v
                else:
                    name = v
                if arch is not None and name is not None:
                    break
            else:
                r.skip_value(t)
    return GGUFHeader(version, n_tensors, n_kv, arch, name)
