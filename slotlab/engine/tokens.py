"""Text-only helpers named after llama-server's `server_tokens` (spec 0.4, SCM:280-801).

slotlab holds a prompt as a 1-D int32 numpy array. Multimodal input is out of scope (spec 12.3), so
no `LLAMA_TOKEN_NULL` media chunks exist and every rule reduces to plain token comparison:
`pos_next(n) == n`, `size_up_to_pos(p) == min(p, size)`.

`common_prefix` is the hot loop of slot selection and of every prompt-cache decision (it runs once
per slot and once per cache entry for each request), so it is vectorised instead of a Python loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ServerTokens", "as_tokens", "common_prefix", "is_prefix"]


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
    # the leading 256 first, then up to 2048: most pairs the server compares (a slot or a cache entry
    # against a new prompt) part early (a shared system prompt, then the first block that differs:
    # four in five of a Mooncake simulation's comparisons part between 256 and 2048), and then the
    # rest of two long prompts is never read
    k = 256 if n > 1024 else n
    neq = a[:k] != b[:k]
    i = int(neq.argmax())  # first True, or 0 when all are False
    if neq[i]:
        return i
    if k == n:
        return n
    if n > 4096:
        neq = a[k:2048] != b[k:2048]
        i = int(neq.argmax())
        if neq[i]:
            return k + i
        k = 2048
    neq = a[k:n] != b[k:n]
    i = int(neq.argmax())
    return k + i if neq[i] else n


def is_prefix(a: Any, b: Any) -> bool:
    """True if `a` is a prefix of (or equal to) `b`: the server's test `lcp(a, b) == len(a)`."""
    return common_prefix(a, b) == np.asarray(a).shape[0]


class ServerTokens:
    """A slot's `prompt.tokens`: exactly the tokens whose KV is in the slot's sequence.

    A growable int32 buffer (appends are amortised O(1), `view()` is a no-copy array for LCP), text
    only, so `pos_next(n) == n` and `size_up_to_pos(p) == min(p, size)`."""

    __slots__ = ("_buf", "_n")

    def __init__(self, tokens: Any = ()):
        arr = as_tokens(tokens)
        self._buf = np.empty(max(16, arr.shape[0]), dtype=np.int32)
        self._buf[: arr.shape[0]] = arr
        self._n = int(arr.shape[0])

    def __len__(self) -> int:
        return self._n

    def view(self) -> np.ndarray:
        """The tokens as an array view (valid until the next mutation)."""
        return self._buf[: self._n]

    def copy(self) -> np.ndarray:
        return self._buf[: self._n].copy()

    def tolist(self) -> list[int]:
        return self._buf[: self._n].tolist()

    def _grow(self, n: int) -> None:
        if n > self._buf.shape[0]:
            buf = np.empty(max(n, 2 * self._buf.shape[0]), dtype=np.int32)
            buf[: self._n] = self._buf[: self._n]
            self._buf = buf

    def push_back(self, token: int) -> None:
        self._grow(self._n + 1)
        self._buf[self._n] = token
        self._n += 1

    def extend(self, tokens: Any) -> None:
        arr = as_tokens(tokens)
        self._grow(self._n + arr.shape[0])
        self._buf[self._n: self._n + arr.shape[0]] = arr
        self._n += int(arr.shape[0])

    def set_token(self, i: int, token: int) -> None:
        if not 0 <= i < self._n:
            raise IndexError(i)
        self._buf[i] = token

    def keep_first(self, n: int) -> None:
        if n < self._n:
            self._n = max(0, int(n))

    def clear(self) -> None:
        self._n = 0

    def assign(self, tokens: Any) -> None:
        self._n = 0
        self.extend(tokens)

    def pos_next(self, n: int | None = None) -> int:
        return self._n if n is None else int(n)

    def size_up_to_pos(self, pos: int) -> int:
        return min(int(pos), self._n)

    def get_common_prefix(self, other: Any) -> int:
        return common_prefix(self.view(), other)
