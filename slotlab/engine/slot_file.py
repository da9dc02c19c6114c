"""Slot files (`POST /slots/{id}?action=save|restore`): filename rules and the token payload.

The file body is `llama_state_seq_save_file`'s: magic, version, a count of 32-bit words, the words,
then the sequence state. The server puts its packed `server_tokens` state in those words (spec 5.3):
i32 -1 marker, u32 version 1, u32 n + n i32 tokens, u32 m + m u32 media starts, media chunks, padding.
Text only here, so there are never media chunks."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

TOKENS_STATE_VERSION = 1
_FORBIDDEN = set(':*?"<>|/\\')


def validate_filename(name: str) -> bool:
    """`fs_validate_filename(name, allow_subdirs=false)` (spec 5.2)."""
    if not isinstance(name, str) or not name:
        return False
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    if len(raw) > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or c in (0xFF0E, 0x2215, 0x2216, 0xFFFD, 0xFEFF):
            return False
        if 0xD800 <= c <= 0xDFFF or c > 0x10FFFF or ch in _FORBIDDEN:
            return False
    if name[0] == " " or name[-1] == " " or name[-1] == "." or ".." in name or name == ".":
        return False
    return True


def pack_tokens(tokens) -> np.ndarray:
    """`server_tokens::serialize` for text tokens, as int32 words."""
    toks = np.asarray(tokens, dtype=np.int32)
    head = np.array([-1, TOKENS_STATE_VERSION, len(toks)], dtype=np.int64).astype(np.uint32).view(np.int32)
    return np.concatenate([head, toks, np.zeros(1, dtype=np.int32)])  # media count 0


class TokensStateError(ValueError):
    pass


def unpack_tokens(words: np.ndarray) -> np.ndarray:
    """`server_tokens::deserialize` (spec 5.4 step 3), text only; raises TokensStateError with the
    server's texts."""
    w = np.asarray(words, dtype=np.int32)
    if len(w) == 0 or w[0] != -1:
        return w.copy()  # legacy: a plain token list
    b = w.tobytes()
    off = 4

    def u32() -> int:
        nonlocal off
        if off + 4 > len(b):
            raise TokensStateError("Unexpected end of server tokens state")
        (v,) = struct.unpack_from("<I", b, off)
        off += 4
        return v

    if u32() != TOKENS_STATE_VERSION:
        raise TokensStateError("Unsupported server tokens state version")
    n = u32()
    if n * 4 > len(b) - off:
        raise TokensStateError("Unexpected end of server tokens state")
    toks = np.frombuffer(b, dtype=np.int32, count=n, offset=off).copy()
    off += 4 * n
    n_media = u32()
    if n_media:
        raise TokensStateError("Cannot restore media tokens without an mmproj")
    if len(b) - off >= 4:
        raise TokensStateError("Trailing data in server tokens state")
    return toks


def save(memory, seq: int, tokens, path) -> int:
    """Write the standard body through the memory; returns bytes written (0 = failure)."""
    return memory.save_file(path, seq, pack_tokens(tokens))


def load(memory, seq: int, path) -> tuple[int, np.ndarray]:
    """Read the standard body into `seq`; returns (bytes read, tokens). (0, []) when llama.cpp
    refused the file; TokensStateError for a bad token payload."""
    nread, words = memory.load_file(path, seq)
    if nread == 0:
        return 0, np.empty(0, dtype=np.int32)
    return nread, unpack_tokens(words)


# --- slotlab extension: the checkpoint ("SCKP") and draft ("SDFT") appendices -----------------------
#
# Not written by the reference llama-server (spec 10.1): slotlab appends them after the standard body
# so a slot file keeps the slot's context checkpoints and the draft context's state. The library's
# loader stops at the end of the state, so a stock llama-server of the same state version restores
# such a file and ignores the appendices. Layout (little-endian):
#   SCKP: u32 magic 0x504b4353, u32 version 1, u32 count, per checkpoint: i64 n_tokens, i32 pos_min,
#         i32 pos_max, then data_tgt, data_dft, data_spec, each u64 length + bytes;
#   SDFT: u32 magic 0x54464453, u32 version 1, u64 length + draft state, u64 length + spec state
#         (written only when one of the two is non-empty; it always follows an SCKP block).
# Files without checkpoints and without draft state get no appendix: byte-identical to the server's.

SCKP_MAGIC, SDFT_MAGIC, APPENDIX_VERSION = 0x504B4353, 0x54464453, 1


def _buf(b) -> bytes:
    b = bytes(b) if not isinstance(b, bytes) else b  # numpy: its raw bytes; a paper blob: its real format
    return struct.pack("<Q", len(b)) + b


def write_appendices(path, checkpoints, draft_state=b"", spec_state=b"") -> int:
    """Append SCKP (+ SDFT) to the file at `path`; returns the bytes appended."""
    if not checkpoints and not len(draft_state) and not len(spec_state):
        return 0
    out = [struct.pack("<III", SCKP_MAGIC, APPENDIX_VERSION, len(checkpoints))]
    for c in checkpoints:
        out.append(struct.pack("<qii", c.n_tokens, c.pos_min, c.pos_max))
        out += [_buf(c.data_tgt), _buf(c.data_dft), _buf(getattr(c, "data_spec", b""))]
    if len(draft_state) or len(spec_state):
        out += [struct.pack("<II", SDFT_MAGIC, APPENDIX_VERSION), _buf(draft_state), _buf(spec_state)]
    data = b"".join(out)
    with open(path, "ab") as f:
        f.write(data)
    return len(data)


@dataclass
class Appendices:
    checkpoints: list = field(default_factory=list)
    draft_state: bytes = b""
    spec_state: bytes = b""
    notes: list = field(default_factory=list)  # why something was skipped (for events / the UI)
    n_bytes: int = 0


def read_appendices(path, offset: int) -> Appendices:
    """Parse what follows the body at `offset` with the article's robustness rules: a wrong magic
    means no appendix; a wrong version is noted and ignored; every length is checked against the bytes
    left BEFORE anything is read; a truncated SCKP gives no checkpoints (the main state stays)."""
    from slotlab.engine.prompt_cache import Checkpoint

    res = Appendices()
    with open(path, "rb") as f:
        f.seek(0, 2)
        end = f.tell()
        f.seek(offset)
        pos = offset

        def take(n: int) -> bytes | None:
            nonlocal pos
            if n < 0 or n > end - pos:
                return None
            b = f.read(n)
            pos += n
            return b

        def take_buf() -> bytes | None:
            """A u64 length and that many bytes, the length checked against what is left first."""
            ln = take(8)
            return None if ln is None else take(struct.unpack("<Q", ln)[0])

        head = take(12)
        if head is None:
            if end > offset:
                res.notes.append(f"{end - offset} trailing bytes are not an appendix")
            return res
        magic, version, count = struct.unpack("<III", head)
        if magic != SCKP_MAGIC:
            res.notes.append(f"no checkpoint appendix (magic {magic:08x})")
            return res
        if version != APPENDIX_VERSION:
            res.notes.append(f"checkpoint appendix version {version} is not supported - ignored")
            return res
        ckpts = []
        for i in range(count):
            fixed = take(16)
            if fixed is None:
                res.notes.append(f"checkpoint appendix truncated at checkpoint {i} of {count} - no checkpoints restored")
                return res
            n_tokens, pos_min, pos_max = struct.unpack("<qii", fixed)
            bufs = []
            for which in ("data_tgt", "data_dft", "data_spec"):
                data = take_buf()
                if data is None:
                    res.notes.append(f"checkpoint appendix truncated in {which} of checkpoint {i} of {count} - "
                                     "no checkpoints restored")
                    return res
                bufs.append(data)
            ckpts.append(Checkpoint(n_tokens=n_tokens, pos_min=pos_min, pos_max=pos_max, id_task=-1,
                                    data_tgt=bufs[0], data_dft=bufs[1], data_spec=bufs[2]))
        res.checkpoints = ckpts
        res.n_bytes = pos - offset
        head = take(8)
        if head is None:
            return res
        magic, version = struct.unpack("<II", head)
        if magic != SDFT_MAGIC:
            res.notes.append(f"no draft appendix (magic {magic:08x})")
            return res
        if version != APPENDIX_VERSION:
            res.notes.append(f"draft appendix version {version} is not supported - ignored")
            return res
        bufs = []
        for which in ("draft state", "speculative state"):
            data = take_buf()
            if data is None:
                res.notes.append(f"draft appendix truncated in the {which} - draft state not restored")
                return res
            bufs.append(data)
        res.draft_state, res.spec_state = bufs
        res.n_bytes = pos - offset
    return res


# --- llama-server b11549's checkpoint appendix (save_slot_checkpoints / load_slot_checkpoints) ----------
#
# From b11549 the server itself appends the slot's context checkpoints to a slot file, in the SCKP layout
# above (no draft block: the draft context's state does not travel), always, and reads them back on
# restore (server-context.cpp:2586-2712 of that tree). Its reading rules differ from slotlab's own:
# a wrong magic is silently no appendix; a wrong version, a truncated checkpoint or an empty target
# state makes the whole appendix "invalid" / "truncated ... - ignored"; a length is checked against
# what is left after the state; at most --ctx-checkpoints are kept (the last ones).

def read_checkpoints_b11549(path, offset: int, n_ctx_checkpoints: int, filename: str = "") -> Appendices:
    """The checkpoints b11549's `load_slot_checkpoints` restores from the file at `path` after the state
    ending at `offset`; `notes` holds its warning (the server's words), `n_bytes` what it consumed (0: no
    usable appendix)."""
    from slotlab.engine.prompt_cache import Checkpoint

    res = Appendices()
    name = filename or str(path)
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        if size < offset:
            return res
        f.seek(offset)
        avail = size - offset
        got = [0]

        def read(n: int) -> bytes | None:
            b = f.read(n)
            if len(b) < n:
                return None
            got[0] += n
            return b

        def read_buf() -> bytes | None:
            ln = read(8)
            if ln is None:
                return None
            n = struct.unpack("<Q", ln)[0]
            if n > avail - got[0]:
                return None
            return b"" if n == 0 else read(n)

        m = read(4)
        if m is None or struct.unpack("<I", m)[0] != SCKP_MAGIC:
            return res
        vc = read(8)
        if vc is None or struct.unpack("<II", vc)[0] != APPENDIX_VERSION:
            res.notes.append(f"invalid context checkpoint appendix in '{name}' - ignored")
            return res
        count = struct.unpack("<II", vc)[1]
        ckpts: list = []
        for _ in range(count):
            fixed = read(16)
            bufs: list = []
            while fixed is not None and len(bufs) < 3 and (not bufs or bufs[-1] is not None):
                bufs.append(read_buf())  # data_tgt, data_dft, data_spec: stops at the first that fails
            if fixed is None or len(bufs) < 3 or bufs[-1] is None:
                res.notes.append(f"truncated context checkpoint appendix in '{name}' - ignored")
                return res
            if not bufs[0]:
                res.notes.append(f"invalid context checkpoint appendix in '{name}' - ignored")
                return res
            n_tokens, pos_min, pos_max = struct.unpack("<qii", fixed)
            ckpts.append(Checkpoint(n_tokens=n_tokens, pos_min=pos_min, pos_max=pos_max, id_task=-1,
                                    data_tgt=bufs[0], data_dft=bufs[1], data_spec=bufs[2]))
            if len(ckpts) > n_ctx_checkpoints:
                ckpts.pop(0)
        res.checkpoints = ckpts
        res.n_bytes = got[0]
    return res
