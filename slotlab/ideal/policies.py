"""Ideal prefix caches of blocks, by eviction policy: what a cache of `capacity` blocks that may keep
any block of any request would reuse (`infinite`, `fifo`, `lru`, `optimal`).

The rules are those of kvcache-simulator 0.1.3 (KVCache.AI, Apache-2.0; kvcache_sim/policies.py),
re-implemented here so that its figures can be reproduced exactly and slotlab's own (every request,
the tokens of the prompts as slotlab holds them) computed the same way:

* a request reuses its leading blocks that are cached (a prefix: the first missing block ends it);
  the lookup touches them (LRU: a new clock value; optimal: the block's next use);
* then its missing blocks are inserted in order. FIFO evicts the oldest inserted block; LRU and
  optimal evict a leaf of the trie (a block no cached block extends), never one of this request's
  own path, LRU the least recently touched, optimal the one used again latest (Belady), refusing
  when that one is used again sooner than the block to insert; a block whose parent is not cached
  is not inserted, and once an insertion fails the rest of the request is not inserted either;
* ties between leaves of equal key go to the higher node id (the later-made trie node), as
  kvcache-simulator's heap orders them.

`measured[r]` says which requests count (numerator and denominator alike); `warmup`: the requests
before it are not counted, and the result says whether the cache was full before it (kvcache-simulator
reports no figure for a budget it never filled: `filled`)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from slotlab.ideal.plan import BlockPlan

POLICIES = ("fifo", "lru", "optimal")


@dataclass(frozen=True)
class Reuse:
    policy: str
    capacity: int  # blocks (0: no cache; -1: infinite)
    hit_tokens: int
    total_tokens: int
    filled: bool  # the cache was full before the first counted request (always True for infinite)

    @property
    def rate(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0


def _counted(plan: BlockPlan, measured, warmup: int) -> tuple[list[bool], int]:
    """(per request: is it counted, the prompt tokens of the counted requests)."""
    count = [r >= warmup and (measured is None or bool(measured[r])) for r in range(plan.n_requests)]
    return count, sum(plan.request_tokens(r) for r in range(plan.n_requests) if count[r])


def infinite(plan: BlockPlan, measured: Sequence[bool] | None = None, warmup: int = 0) -> Reuse:
    """Every block ever seen kept: a request reuses its leading blocks seen before."""
    seen = bytearray(len(plan.parent))
    count, total = _counted(plan, measured, warmup)
    hit = 0
    st, node, tok = plan.starts, plan.node, plan.tokens
    for r in range(plan.n_requests):
        a, b = st[r], st[r + 1]
        if count[r]:
            for i in range(a, b):
                if not seen[node[i]]:
                    break
                hit += tok[i]
        for i in range(a, b):
            seen[node[i]] = 1
    return Reuse("infinite", -1, hit, total, True)


def fifo(plan: BlockPlan, capacity: int, measured: Sequence[bool] | None = None, warmup: int = 0) -> Reuse:
    count, total = _counted(plan, measured, warmup)
    if capacity <= 0 or not plan.node:
        return Reuse("fifo", capacity, 0, total, False)
    cached = bytearray(len(plan.parent))
    queue: list[int] = []
    head = size = hit = 0
    filled = False
    st, node, tok = plan.starts, plan.node, plan.tokens
    for r in range(plan.n_requests):
        a, b = st[r], st[r + 1]
        if count[r]:
            for i in range(a, b):
                if not cached[node[i]]:
                    break
                hit += tok[i]
        for i in range(a, b):
            n = node[i]
            if cached[n]:
                continue
            if size >= capacity:
                while head < len(queue):
                    v = queue[head]
                    head += 1
                    if cached[v]:
                        cached[v] = 0
                        size -= 1
                        break
            if size < capacity:
                cached[n] = 1
                size += 1
                queue.append(n)
                if size >= capacity and r < warmup:
                    filled = True
            if head > 1_000_000 and head * 2 > len(queue):
                del queue[:head]
                head = 0
    return Reuse("fifo", capacity, hit, total, filled or warmup == 0)


def trie(plan: BlockPlan, capacity: int, optimal: bool, measured: Sequence[bool] | None = None,
         warmup: int = 0) -> Reuse:
    """LRU (`optimal` False) or Belady-optimal eviction of trie leaves (module docstring)."""
    name = "optimal" if optimal else "lru"
    count, total = _counted(plan, measured, warmup)
    if capacity <= 0 or not plan.node:
        return Reuse(name, capacity, 0, total, False)
    nn = len(plan.parent)
    present = bytearray(nn)
    present[0] = 1
    children = [0] * nn
    version = [0] * nn
    key = [0] * nn
    guard = [0] * nn
    mark = 1
    heap: list[tuple[int, int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    sign = -1 if optimal else 1  # optimal: the largest next use first
    clock = size = hit = 0
    filled = False
    st, node, tok, nxt, parent = plan.starts, plan.node, plan.tokens, plan.next_use, plan.parent

    def leaf(n: int) -> None:
        if n and present[n] and children[n] == 0:
            version[n] += 1
            push(heap, (sign * key[n], -n, version[n], n))

    def touch(n: int, i: int) -> None:
        """Event i used node n: its key (optimal: the next use; LRU: a new clock value), as a leaf."""
        nonlocal clock
        if optimal:
            key[n] = nxt[i]
        else:
            clock += 1
            key[n] = clock
        leaf(n)

    for r in range(plan.n_requests):
        a, b = st[r], st[r + 1]
        c = count[r]
        for i in range(a, b):  # lookup: the cached prefix, touched
            n = node[i]
            if not present[n]:
                break
            if c:
                hit += tok[i]
            touch(n, i)
        mark += 1
        guard[0] = mark
        for i in range(a, b):
            if present[node[i]]:
                guard[node[i]] = mark
        for i in range(a, b):  # insertion
            n = node[i]
            if present[n]:
                continue
            if size >= capacity:
                cand = nxt[i] if optimal else 0
                held = []
                evicted = False
                while heap:
                    item = pop(heap)
                    k, _m, ver, v = item
                    k = sign * k
                    if not present[v] or children[v] or version[v] != ver or key[v] != k:
                        continue
                    if guard[v] == mark:
                        held.append(item)
                        continue
                    if optimal and k <= cand:
                        push(heap, item)
                        break
                    present[v] = 0
                    size -= 1
                    p = parent[v]
                    children[p] -= 1
                    if p and present[p] and children[p] == 0:
                        leaf(p)
                    evicted = True
                    break
                for item in held:
                    push(heap, item)
                if not evicted:
                    break
            if size < capacity and present[parent[n]]:
                present[n] = 1
                size += 1
                children[parent[n]] += 1
                touch(n, i)
                if size >= capacity and r < warmup:
                    filled = True
            else:
                break
    return Reuse(name, capacity, hit, total, filled or warmup == 0)


def run(plan: BlockPlan, policy: str, capacity: int, measured=None, warmup: int = 0) -> Reuse:
    if policy == "fifo":
        return fifo(plan, capacity, measured, warmup)
    if policy in ("lru", "optimal"):
        return trie(plan, capacity, policy == "optimal", measured, warmup)
    if policy == "infinite":
        return infinite(plan, measured, warmup)
    raise ValueError(f"unknown policy {policy!r} (one of infinite, {', '.join(POLICIES)})")


__all__ = ["POLICIES", "Reuse", "fifo", "infinite", "run", "trie"]
