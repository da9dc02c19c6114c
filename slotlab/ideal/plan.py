"""A trace's prompts as paths in a trie of blocks: what every ideal-cache policy walks.

Each request is a sequence of block ids (Mooncake `hash_ids`: block i names the whole prefix up to
it). Block ids are interned into trie nodes keyed by (parent node, id), so two requests share a node
exactly where they share the prefix up to that block; node 0 is the root. Per event (one block of one
request) the plan keeps its node, the tokens it stands for, and the index of the next request that
uses the same node (Belady's "next use"; `never` when none).

The token count of a block follows the caller: kvcache-simulator's rule (`kvsim_block_tokens`: the
last block cut to the prompt, a block past the prompt's end still one token) when its figures are to
be reproduced; the tokens slotlab's own prompt holds otherwise (slotlab.sim.traces: the blocks the
prompt's length reaches, its tail of never-shared tokens counted in the request's total only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def kvsim_block_tokens(input_length: int, block_size: int, index: int, count: int) -> int:
    """Tokens block `index` of `count` stands for, as kvcache-simulator 0.1.3 counts them
    (kvcache_sim/trace.py `block_tokens`, Apache-2.0)."""
    if count <= 0:
        return 0
    if input_length <= 0:
        return block_size
    if block_size <= 0:
        return max(1, round(input_length / count))
    remaining = input_length - index * block_size
    if remaining <= 0:
        return 1
    return max(1, min(block_size, remaining))


@dataclass
class BlockPlan:
    starts: list[int]  # request r's events are starts[r]:starts[r + 1]
    node: list[int]  # per event: its trie node (>= 1)
    tokens: list[int]  # per event: the tokens the block stands for
    next_use: list[int]  # per event: the next request using the node (`never` if none); [] if not computed
    parent: list[int]  # per node: its parent (node 0: the root)
    extra: list[int]  # per request: prompt tokens outside every block (never reusable)
    never: int

    @property
    def n_requests(self) -> int:
        return len(self.starts) - 1

    @property
    def n_nodes(self) -> int:
        """Distinct prefix blocks (the root not counted)."""
        return len(self.parent) - 1

    def request_tokens(self, r: int) -> int:
        return sum(self.tokens[self.starts[r]:self.starts[r + 1]]) + self.extra[r]


def build_plan(blocks: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]],
               extra: Sequence[int] | None = None, next_use: bool = True) -> BlockPlan:
    """The plan of requests given as block ids (`blocks[r]`) and per-block token counts (`tokens[r]`);
    `extra[r]`: tokens of request r outside its blocks. `next_use` False: the next uses are not
    computed (`next_use` is empty), for the policies that never look ahead (`infinite`; the bound
    `slotlab simulate` reports on every run takes `slotlab.ideal.infinite_hit_tokens`, which needs
    no plan at all)."""
    node: list[int] = []
    tok: list[int] = []
    starts = [0]
    parent = [0]
    edges: dict[tuple[int, int], int] = {}
    get = edges.get
    for ids, ts in zip(blocks, tokens):
        p = 0
        for h, t in zip(ids, ts):
            k = (p, h)
            n = get(k)
            if n is None:
                n = edges[k] = len(parent)
                parent.append(p)
            node.append(n)
            tok.append(t)
            p = n
        starts.append(len(node))
    n_req = len(starts) - 1
    never = n_req + 1
    nu: list[int] = []
    if next_use:
        nu = [never] * len(node)
        last = [never] * len(parent)
        for r in range(n_req - 1, -1, -1):
            a, b = starts[r], starts[r + 1]
            for i in range(a, b):
                nu[i] = last[node[i]]
            for i in range(a, b):
                last[node[i]] = r
    return BlockPlan(starts, node, tok, nu, parent, list(extra) if extra is not None else [0] * n_req, never)


__all__ = ["BlockPlan", "build_plan", "kvsim_block_tokens"]
