"""What a router can read off a request: its session key and its prompt's block chain.

Why a module of its own: every router that is not blind (session, prefix) must say what it sees,
and it sees only the request as sent, never a server's internals. Keys are hashed with blake2b, not
Python's `hash`, so a routing is the same in every process and every run (bytes' `hash` is salted
per process)."""

from __future__ import annotations

import hashlib

import numpy as np

#: blocks of a request's prompt a session key is made of where the trace names no conversation.
#: Two, not one: every request of Mooncake's conversation trace begins with block 0 (a system
#: prompt they all share), so a key of the first block alone sends the whole trace to one server.
SESSION_BLOCKS = 2
#: prompt tokens a session key is made of where the trace has neither a conversation key nor block ids
SESSION_TOKENS = 1024
#: tokens a router hashes into one block of a prompt that has no block ids (slotlab traces, session
#: logs): a KV-aware router indexes KV blocks of tens of tokens (Dynamo: the engine's block size),
#: and a chat prompt is often shorter than Mooncake's 512-token blocks
BLOCK_TOKENS = 64


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def stable_hash(key) -> int:
    """A process-independent 64-bit hash of a key made of str / int / tuples of them."""
    return _digest(repr(key).encode())


def session_key(req, vocab=None):
    """The conversation a request belongs to, as a sticky-session router keys it: the trace's own
    conversation key where it has one (session logs: `session`), else its first `SESSION_BLOCKS`
    block ids (Mooncake), else a digest of its first `SESSION_TOKENS` prompt tokens."""
    if req.session is not None:
        return ("session", str(req.session))
    if req.hash_ids:
        return ("blocks", tuple(int(h) for h in req.hash_ids[:SESSION_BLOCKS]))
    toks = np.asarray(req.tokens(vocab), dtype=np.int32)[:SESSION_TOKENS]
    return ("tokens", _digest(toks.tobytes()))


def block_chain(req, block: int, vocab=None) -> list[int]:
    """The chained keys of the prompt's full blocks (key j names blocks 0..j, as a KV-aware router's
    radix index or Dynamo's block hashes do): from the trace's block ids where it has them (each id
    already names its prefix: Mooncake), else from the tokens, `BLOCK_TOKENS` at a time. A last,
    partial block is left out: a router indexes whole blocks."""
    out: list[int] = []
    prev = 0
    if req.hash_ids and block:
        n_full = req.n_prompt // block
        for h in req.hash_ids[:n_full]:
            prev = stable_hash((prev, int(h)))
            out.append(prev)
        return out
    toks = np.asarray(req.tokens(vocab), dtype=np.int32)
    for j in range(len(toks) // BLOCK_TOKENS):
        prev = _digest(prev.to_bytes(8, "little") + toks[j * BLOCK_TOKENS:(j + 1) * BLOCK_TOKENS].tobytes())
        out.append(prev)
    return out
