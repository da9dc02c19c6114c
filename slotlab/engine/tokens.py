"""Text-only helpers named after llama-server's `server_tokens` (spec 0.4, SCM:421-840).

slotlab holds a prompt as a 1-D int32 numpy array. Multimodal input is out of scope (spec 12.3), so
no `LLAMA_TOKEN_NULL` media chunks exist and every rule reduces to plain token comparison:
`pos_next(n) == n`, `size_up_to_pos(p) == min(p, size)`.

`common_prefix` is the hot loop of slot selection and of every prompt-cache decision (it runs once
per slot and once per cache entry for each request), so it is vectorised instead of a Python loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_tokens", "common_prefix", "is_prefix"]


def as_tokens(tokens: Any, *, copy: bool = False) -> np.ndarray:
    """`tokens` as a 1-D int32 array (a view when possible, unless `copy`).

    int32 because that is `llama_token`; anything else (Python ints, int64 from a tokenizer) is
    converted so that comparisons and byte layouts match the C++ side."""
    arr = np.array(tokens, dtype=np.int32, copy=True) if copy else np.asarray(tokens, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"a token list must be 1-D, got shape {arr.shape}")
    return arr


def common_prefix(a: Any, b: Any) -> int:
    """Length of the equal leading run of `a` and `b` (`server_tokens::get_common_prefix`, text path):
    the index of the first mismatch, or `min(len(a), len(b))` if there is none."""
    a = np.asarray(a)
    b = np.asarray(b)
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    neq = a[:n] != b[:n]
    i = int(neq.argmax())  # first True, or 0 when all are False
    return i if neq[i] else n


def is_prefix(a: Any, b: Any) -> bool:
    """True if `a` is a prefix of (or equal to) `b`: the server's test `lcp(a, b) == len(a)`."""
    return common_prefix(a, b) == np.asarray(a).shape[0]
