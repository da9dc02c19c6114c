"""The ideal cache beside llama-server: how much an ideal prefix cache of the same memory would reuse
on the same traffic, by eviction policy, so a simulation says how far the server is from the best.

`bounds(trace, ok, budget_bytes, bytes_per_token)` runs the ideal caches (slotlab.ideal.policies) over
a trace with block ids (Mooncake `hash_ids`) twice:

* slotlab's way: every request in order, the blocks its prompt holds as slotlab holds it (the tail
  past the last block never reusable), counted over the requests that succeeded (`ok`, the requests
  `totals` counts: a failed request counts in neither numerator nor denominator), in prompt tokens;
  the capacity is the memory the flags give (the slots' KV plus `--cache-ram`) in blocks of the
  model's KV bytes per token (every layer of the profile at f16 unless -ctk/-ctv say otherwise);
* kvcache-simulator's way (`kvsim_rates`): its block token counts, the last half of the requests
  counted, in percent: the figures that tool prints at the same budget.

Nothing here knows llama-server; slotlab.sim.simulate puts the result in `totals["bounds"]`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from slotlab.ideal.plan import BlockPlan, build_plan, kvsim_block_tokens
from slotlab.ideal.policies import POLICIES, Reuse, run

GIB = 2**30


def _blocks_reached(n: int, ids, block: int) -> int:
    """How many of a prompt's block ids slotlab's Mooncake loader uses: those its length reaches."""
    return min(len(ids), -(-n // block)) if block else 0


def slotlab_plan(requests, block: int, next_use: bool = True) -> BlockPlan:
    """The plan of prompts as slotlab's Mooncake loader makes them: the blocks the prompt's length
    reaches, the last cut to it, tokens past the last block a tail of their own (`next_use`: see
    `build_plan`)."""
    blocks, tokens, extra = [], [], []
    for q in requests:
        n = max(0, int(q.n_prompt))
        ids = list(q.hash_ids or ())
        nb = _blocks_reached(n, ids, block)
        blocks.append(ids[:nb])
        tokens.append([min(block, n - i * block) for i in range(nb)])
        extra.append(max(0, n - nb * block))
    return build_plan(blocks, tokens, extra, next_use=next_use)


def infinite_hit_tokens(requests, block: int, measured: Sequence[bool] | None = None) -> tuple[int, int]:
    """(hit tokens, prompt tokens) of the infinite cache over `slotlab_plan(requests, block)`, counted
    over the `measured` requests (all when None): `infinite(slotlab_plan(...), measured)` in one pass.

    Why it is the same: the infinite cache has seen a trie node exactly when an earlier request made
    it, and a request's blocks are a path (each a child of the one before), so its hits are the
    leading blocks whose (parent, id) edge existed before it, and once one is new all after it are.
    Interning the edges while walking counts them without the plan's lists (`slotlab simulate` asks
    for this bound on every run, the what-if grid once a point)."""
    edges: dict[tuple[int, int], int] = {}
    get = edges.get
    hit = total = 0
    for r, q in enumerate(requests):
        n = max(0, int(q.n_prompt))
        ids = q.hash_ids or ()
        nb = _blocks_reached(n, ids, block)
        counted = measured is None or bool(measured[r])
        if counted:
            total += n  # (the blocks' tokens, the last cut to the prompt, plus the tail past them)
        p = 0
        i = 0
        while i < nb:  # the edges seen before: hits
            k = get((p, ids[i]))
            if k is None:
                break
            if counted:
                hit += min(block, n - i * block)
            p = k
            i += 1
        while i < nb:  # new from here on: interned
            k = edges[(p, ids[i])] = len(edges) + 1
            p = k
            i += 1
    return hit, total


def kvsim_plan(requests, block: int) -> BlockPlan:
    """The plan as kvcache-simulator 0.1.3 reads a Mooncake trace (every hash id, its block tokens)."""
    blocks, tokens = [], []
    for q in requests:
        ids = list(q.hash_ids or ())
        blocks.append(ids)
        tokens.append([kvsim_block_tokens(int(q.n_prompt), block, i, len(ids)) for i in range(len(ids))])
    return build_plan(blocks, tokens)


def capacity_blocks(budget_bytes: float, bytes_per_token: float, block: int) -> int:
    """Blocks of `block` tokens in `budget_bytes` (kvcache-simulator: floor(GiB * 2^30 / bytes per
    block)); -1 for an unlimited budget."""
    if math.isinf(budget_bytes):
        return -1
    return max(0, math.floor(budget_bytes / (bytes_per_token * block)))


def kvsim_rates(plan: BlockPlan, capacity: int, policies: Sequence[str] = POLICIES,
                warmup_fraction: float = 0.5) -> dict[str, float | None]:
    """{policy: hit rate in percent} as kvcache-simulator computes it at `capacity` blocks (the last
    `1 - warmup_fraction` of the requests counted; None where the cache was not full by then, which
    that tool reports as no figure)."""
    warm = max(0, min(plan.n_requests, math.floor(plan.n_requests * warmup_fraction)))
    out: dict[str, float | None] = {}
    for p in policies:
        if capacity < 0 or (plan.n_nodes and capacity > plan.n_nodes):
            out[p] = None  # more room than blocks: that tool stops its sweep there
            continue
        r = run(plan, p, capacity, warmup=warm)
        out[p] = 100.0 * r.rate if r.filled else None
    return out


@dataclass
class Bounds:
    budget_bytes: float
    capacity: int  # blocks (-1: unlimited)
    block: int
    reuse: dict[str, Reuse] = field(default_factory=dict)  # infinite, fifo, lru, optimal
    kvsim: dict[str, float | None] = field(default_factory=dict)

    def as_json(self) -> dict:
        r = self.reuse
        return {"budget_gib": None if math.isinf(self.budget_bytes) else round(self.budget_bytes / GIB, 6),
                "capacity_blocks": self.capacity, "block_tokens": self.block,
                "infinite": r["infinite"].hit_tokens, "fifo": r["fifo"].hit_tokens, "lru": r["lru"].hit_tokens,
                "optimal": r["optimal"].hit_tokens, "prompt_tokens": r["infinite"].total_tokens,
                "kvcache_simulator": {k: None if v is None else round(v, 3) for k, v in self.kvsim.items()},
                "counts": "reused prompt tokens of the requests that succeeded (the requests and tokens of "
                          "totals), each request's prompt as slotlab holds it; kvcache_simulator: that tool's "
                          "hit rate in percent at the same budget (its block tokens, the last half of the "
                          "requests; null where it reports none)"}

    def lines(self, prompt_tokens: int) -> list[str]:
        return self.lines_of(self.as_json(), prompt_tokens)

    @staticmethod
    def lines_of(d: dict, prompt_tokens: int) -> list[str]:
        """The report's lines from `as_json()` (what `totals["bounds"]` holds)."""
        pct = lambda n: f"{100 * n / prompt_tokens:.1f} %" if prompt_tokens else "-"  # noqa: E731
        mem = ("unlimited memory" if d["capacity_blocks"] < 0 else
               f"{d['budget_gib']:.2f} GiB = {d['capacity_blocks']} blocks")
        out = [f"an ideal prefix cache of the same memory ({mem} of {d['block_tokens']} tokens: the slots' KV "
               f"plus --cache-ram) could reuse: LRU {d['lru']} ({pct(d['lru'])}), FIFO {d['fifo']} "
               f"({pct(d['fifo'])}), optimal {d['optimal']} ({pct(d['optimal'])}); infinite {d['infinite']} "
               f"({pct(d['infinite'])})"]
        ks = ", ".join(f"{k} {'-' if v is None else f'{v:.1f} %'}" for k, v in d["kvcache_simulator"].items())
        out.append(f"            as kvcache-simulator counts it (its hit rate: blocks, the last half of the "
                   f"requests): {ks}")
        return out


def bounds(trace, ok: Sequence[bool], budget_bytes: float, bytes_per_token: float) -> Bounds | None:
    """The ideal caches of `budget_bytes` over `trace` (module docstring); None without block ids."""
    block = int(getattr(trace, "block", 0) or 0)
    if not block or not any(q.hash_ids for q in trace.requests):
        return None
    cap = capacity_blocks(budget_bytes, bytes_per_token, block)
    plan = slotlab_plan(trace.requests, block)
    b = Bounds(budget_bytes, cap, block)
    b.reuse["infinite"] = run(plan, "infinite", -1, ok)
    for p in POLICIES:
        b.reuse[p] = b.reuse["infinite"] if cap < 0 else run(plan, p, cap, ok)
    b.kvsim = kvsim_rates(kvsim_plan(trace.requests, block), cap)
    return b


__all__ = ["Bounds", "bounds", "capacity_blocks", "infinite_hit_tokens", "kvsim_plan", "kvsim_rates",
           "slotlab_plan"]
