"""Slot files (`POST /slots/{id}?action=save|restore`): filename rules and the token payload.

The file body is `llama_state_seq_save_file`'s: magic, version, a count of 32-bit words, the words,
then the sequence state. The server puts its packed `server_tokens` state in those words (spec 5.3):
i32 -1 marker, u32 version 1, u32 n + n i32 tokens, u32 m + m u32 media starts, media chunks, padding.
Text only here, so there are never media chunks."""

from __future__ import annotations

import struct

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


def save(ctx, seq: int, tokens, path) -> int:
    """Write the standard body; returns bytes written (0 = failure)."""
    return ctx.state_seq_save_file(path, seq, pack_tokens(tokens))


def load(ctx, seq: int, path) -> tuple[int, np.ndarray]:
    """Read the standard body into `seq`; returns (bytes read, tokens). (0, []) when llama.cpp
    refused the file; TokensStateError for a bad token payload."""
    nread, words = ctx.state_seq_load_file(path, seq)
    if nread == 0:
        return 0, np.empty(0, dtype=np.int32)
    return nread, unpack_tokens(words)
