"""Traces for the simulator: requests with arrival times.

* slotlab trace JSON (`slotlab.engine.replay`): `{"flags": [...], "requests": [...]}`; a request may
  also carry `"arrival"` (seconds from the start; default: all at 0, sent in order), `"prompt"` as
  text (tokenized with the model's vocabulary) or as a list of token ids, and `"output"` (the token
  ids it generated, which the simulation replays instead of placeholders). Slot actions are not
  simulated (they are skipped, with a note).
* Mooncake JSONL (FAST'25 traces): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
  (one id per 512-token block; equal ids at the same position are equal prefixes). Each block id
  maps to its own deterministic token ids (`block_tokens`), the last block cut to input_length; the
  tokens are made when the request is submitted, so a trace of 145 M prompt tokens needs no memory
  for them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

__all__ = ["SimRequest", "SimTrace", "block_tokens", "load_sim_trace", "load_mooncake", "infinite_cache_bound"]

BLOCK = 512


@dataclass
class SimRequest:
    arrival: float  # seconds
    n_prompt: int
    n_predict: int
    make_tokens: Callable[[], np.ndarray] | None = None
    prompt: str | list | None = None  # text / ids (slotlab traces)
    output: np.ndarray | None = None
    hash_ids: Sequence[int] | None = None
    fields: dict = field(default_factory=dict)  # id_slot, cache_prompt, n_cache_reuse, ...

    def tokens(self, vocab=None) -> np.ndarray:
        if self.make_tokens is not None:
            return self.make_tokens()
        if isinstance(self.prompt, str):
            if vocab is None:
                raise ValueError("a text prompt needs the model's vocabulary (-m MODEL)")
            return vocab.tokenize(self.prompt)
        return np.asarray(self.prompt, dtype=np.int32)


@dataclass
class SimTrace:
    flags: list[str]
    requests: list[SimRequest]
    path: str | None = None
    notes: list[str] = field(default_factory=list)
    block: int = 0  # block size of hash_ids (0: none)


_MUL = np.uint64(0x9E3779B97F4A7C15)


def block_tokens(block_id: int, n: int, lo: int, hi: int) -> np.ndarray:
    """`n` token ids in [lo, hi) for prefix block `block_id`: a fixed function of (id, offset)."""
    x = (np.uint64(block_id) * np.uint64(BLOCK) + np.arange(n, dtype=np.uint64) + np.uint64(1)) * _MUL
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(32)
    return (lo + (x % np.uint64(hi - lo))).astype(np.int32)


@functools.lru_cache(maxsize=8192)
def _full_block(block_id: int, lo: int, hi: int) -> np.ndarray:
    """`block_tokens(block_id, BLOCK, lo, hi)`, cached (blocks recur: shared prefixes); read-only."""
    a = block_tokens(block_id, BLOCK, lo, hi)
    a.flags.writeable = False
    return a


def _mooncake_maker(hash_ids, n: int, lo: int, hi: int) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        parts, left = [], n
        for h in hash_ids:
            k = min(BLOCK, left)
            if k <= 0:
                break
            parts.append(_full_block(int(h), lo, hi)[:k])  # a block's first k tokens: block_tokens(h, k)
            left -= k
        if left > 0:  # more tokens than blocks: a tail of its own (never shared)
            parts.append(block_tokens(-1 & 0x7FFFFFFFFFFF, left, lo, hi))
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    return make


def load_mooncake(path, *, limit: int | None = None, lo: int = 10, hi: int = 120_000,
                  time_scale: float = 1.0) -> SimTrace:
    """A Mooncake JSONL trace. Token ids come from [lo, hi) (keep hi below the paper vocabulary's
    placeholder range, `PaperVocab.gen_lo`). `time_scale` < 1 compresses the arrivals."""
    reqs = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            n = int(d["input_length"])
            hs = list(d.get("hash_ids") or [])
            reqs.append(SimRequest(arrival=d.get("timestamp", 0) / 1000.0 * time_scale, n_prompt=n,
                                   n_predict=int(d.get("output_length", 16)),
                                   make_tokens=_mooncake_maker(hs, n, lo, hi), hash_ids=hs))
            if limit and len(reqs) >= limit:
                break
    reqs.sort(key=lambda r: r.arrival)  # stable: file order among equal timestamps
    return SimTrace([], reqs, str(path), block=BLOCK)


def load_sim_trace(path, *, limit: int | None = None, **kw) -> SimTrace:
    """A Mooncake `.jsonl` or a slotlab trace `.json` (module docstring)."""
    p = Path(path)
    if p.suffix == ".jsonl":
        return load_mooncake(p, limit=limit, **kw)
    data = json.loads(p.read_text())
    flags = list(data.get("flags", []))
    reqs, notes = [], []
    for i, r in enumerate(data.get("requests", [])):
        if "action" in r:
            notes.append(f"request {i}: slot action {r['action']} not simulated")
            continue
        extra = {k: r[k] for k in ("id_slot", "cache_prompt", "n_cache_reuse", "temperature", "seed",
                                   "message_delimiters") if k in r}
        out = np.asarray(r["output"], dtype=np.int32) if r.get("output") is not None else None
        prompt = r["prompt"]
        reqs.append(SimRequest(arrival=float(r.get("arrival", 0.0)), n_prompt=-1 if isinstance(prompt, str) else len(prompt),
                               n_predict=int(r.get("n_predict", -1)), prompt=prompt, output=out, fields=extra))
        if limit and len(reqs) >= limit:
            break
    reqs.sort(key=lambda q: q.arrival)
    return SimTrace(flags, reqs, str(p), notes)


def infinite_cache_bound(trace: SimTrace) -> tuple[int, int]:
    """(tokens reusable if every prefix ever seen were kept, prompt tokens): per request, the leading
    blocks whose prefix id appeared in an earlier request (Mooncake hash_ids). (0, 0) without ids."""
    if not trace.block:
        return 0, 0
    seen: set[int] = set()
    hit = total = 0
    for r in trace.requests:
        k = 0
        for h in r.hash_ids or ():
            if h in seen:
                k += 1
            else:
                break
        hit += min(k * trace.block, r.n_prompt)
        total += r.n_prompt
        seen.update(r.hash_ids or ())
    return hit, total
