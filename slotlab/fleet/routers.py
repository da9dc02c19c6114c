"""The routers in front of the fleet, and what each one sees.

A router sees only what it sends and what comes back, never a server's cache:

* `round-robin` (llama-swap's / LiteLLM's simple-shuffle / nginx's default): request k goes to
  server k mod N. Sees nothing.
* `session` (sticky sessions: nginx `hash ... consistent`, LiteLLM's session affinity): a stable
  hash of the request's session key (`keys.session_key`: the trace's conversation key, else its
  first block ids / first tokens) mod N. Sees the key only.
* `prefix` (a KV-aware router: SGLang's cache-aware router, Dynamo's KV router, as approximated
  here): its OWN index, per server, of the prompt blocks (chained block keys, `keys.block_chain`) it
  has sent there, LRU-bounded to `index_blocks` keys a server. A request goes to the server whose
  index holds its longest prefix, if that prefix is more than `cache_threshold` of the request's
  blocks (SGLang's cache-aware rule, its default 0.5); otherwise (a new conversation, or one whose
  only shared block is a system prompt every server holds) to the server whose index is smallest, as
  SGLang does. Ties to the server it has sent fewest requests, then the lowest number. It does not
  see evictions in the servers, so its index can claim a prefix a server has dropped (that is the
  approximation of a router without KV events); SGLang's load-balance override (by requests in
  flight) is left out, which keeps this router static.
* `least-loaded` (LiteLLM's least-busy, nginx `least_conn`): the server with the fewest requests in
  flight at the arrival, counted from what the router sent and which replies came back by then
  (a reply comes back at the request's `end`); ties to the lowest number. Depends on the servers'
  completions: run by `lockstep`.

The first three are *static*: their choice depends only on their own past choices, so the trace can
be split up front. Every choice is a `Choice` (server, why, and the numbers the why quotes), kept
per request in the fleet's output.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from slotlab.errors import ConfigError
from slotlab.fleet.keys import block_chain, session_key, stable_hash

#: LRU bound of the prefix router's index, per server (keys of 512-token blocks: 32 M tokens)
INDEX_BLOCKS = 65_536
#: the share of a prompt's blocks a server's index must hold for the prefix router to follow it (SGLang's
#: cache_threshold default)
CACHE_THRESHOLD = 0.5


@dataclass
class Choice:
    server: int
    why: str
    data: dict = field(default_factory=dict)

    def record(self, i: int, arrival: float) -> dict:
        return {"event": "route", "i": i, "arrival": round(arrival, 6), "server": self.server, "why": self.why,
                **self.data}


class Router:
    name = ""
    static = True  # the choice depends only on the router's own past choices
    sees = ""

    def __init__(self, n: int, **_):
        self.n = n

    def choose(self, i: int, req, in_flight: list[int] | None = None) -> Choice:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"
    sees = "nothing: request k goes to server k mod N"

    def __init__(self, n: int, **kw):
        super().__init__(n)
        self.k = 0

    def choose(self, i, req, in_flight=None):
        s = self.k % self.n
        self.k += 1
        return Choice(s, f"round-robin: turn {self.k - 1} mod {self.n}")


class Session(Router):
    name = "session"
    sees = ("the session key: the trace's conversation key, else the first block ids / first tokens "
            "(slotlab.fleet.keys.session_key), hashed mod N")

    def __init__(self, n: int, vocab=None, **kw):
        super().__init__(n)
        self.vocab = vocab

    def choose(self, i, req, in_flight=None):
        key = session_key(req, self.vocab)
        s = stable_hash(key) % self.n
        kind, v = key
        return Choice(s, f"session: {kind} {v if kind != 'blocks' else list(v)} hashes to server {s}")


class Prefix(Router):
    name = "prefix"

    def __init__(self, n: int, block: int = 512, vocab=None, index_blocks: int = INDEX_BLOCKS,
                 cache_threshold: float = CACHE_THRESHOLD, **kw):
        super().__init__(n)
        self.block, self.vocab, self.cap = block or 512, vocab, max(1, int(index_blocks))
        self.threshold = float(cache_threshold)
        self.index: list[OrderedDict] = [OrderedDict() for _ in range(n)]
        self.sent = [0] * n

    @property
    def sees(self) -> str:
        return (f"its own index of the prompt blocks it sent to each server (chained block keys, LRU, at most "
                f"{self.cap} blocks a server), not the servers' caches: the longest prefix if it covers "
                f"more than {self.threshold:g} of the prompt's blocks, else the smallest index; ties to the "
                "fewest sent")

    def match(self, chain: list[int]) -> list[int]:
        """Per server, how many leading blocks of `chain` its index holds."""
        out = []
        for ix in self.index:
            m = 0
            for key in chain:
                if key not in ix:
                    break
                m += 1
            out.append(m)
        return out

    def choose(self, i, req, in_flight=None):
        chain = block_chain(req, self.block, self.vocab)
        m = self.match(chain)
        best = max(m)
        hit = best > 0 and best > self.threshold * len(chain)
        if hit:
            s = min(range(self.n), key=lambda j: (-m[j], self.sent[j], j))
            tied = sum(1 for x in m if x == best)
        else:
            lo = min(len(ix) for ix in self.index)
            s = min(range(self.n), key=lambda j: (len(self.index[j]), self.sent[j], j))
            tied = sum(1 for ix in self.index if len(ix) == lo)
        ix = self.index[s]
        for key in reversed(chain):  # the root last: the most recently used, evicted last (leaves go first)
            ix[key] = None
            ix.move_to_end(key)
        while len(ix) > self.cap:
            ix.popitem(last=False)
        self.sent[s] += 1
        why = (f"prefix: {best} of {len(chain)} blocks in the index of server {s}" if hit else
               f"prefix: best match {best} of {len(chain)} blocks, not over {self.threshold:g}: the smallest index")
        if tied > 1:
            why += f" ({tied} tied: fewest sent)"
        return Choice(s, why, {"matched_blocks": best, "blocks": len(chain)})


class LeastLoaded(Router):
    name = "least-loaded"
    static = False
    sees = ("requests in flight per server at the arrival: those it sent minus the replies back by then "
            "(a reply is back at the request's end); ties to the lowest number")

    def choose(self, i, req, in_flight=None):
        lo = min(in_flight)
        s = in_flight.index(lo)
        tied = in_flight.count(lo)
        return Choice(s, f"least-loaded: {lo} in flight" + (f" ({tied} tied: lowest number)" if tied > 1 else ""),
                      {"in_flight": list(in_flight)})


ROUTERS = {r.name: r for r in (RoundRobin, LeastLoaded, Session, Prefix)}


def make_router(name: str, n: int, **kw) -> Router:
    """The router `name` for `n` servers; a clear error for an unknown name or a fleet of no server."""
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"--fleet {n}: a fleet has at least 1 server")
    if name not in ROUTERS:
        raise ConfigError(f"--router {name}: unknown router (one of: {', '.join(ROUTERS)})")
    return ROUTERS[name](n, **kw)
