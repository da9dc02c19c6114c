"""`simulate_fleet`: N llama-servers on paper behind a router.

How it runs: a static router (round-robin, session, prefix: the choice depends only on its own past
choices) routes the whole trace first, then each server simulates its part, independently: serially
or one Dask task a server (`servers`). least-loaded depends on the servers' completions and runs in
`lockstep` (exact: see there for how and what it costs). Either way each server is an unchanged
`slotlab.sim.simulate` run of its requests under the same flags and profile; a fleet of one is
`slotlab simulate` itself (the same rows, the same totals)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from slotlab.errors import ConfigError
from slotlab.fleet import capacity
from slotlab.fleet.routers import make_router
from slotlab.fleet.servers import Runner, ServerRun, Setup, run_parts
from slotlab.fleet.split import parts_of
from slotlab.fleet.summary import merge_totals

#: the server summary fields printed per server (a subset of the totals; --json has them all)
_SERVER_COLS = ("n_requests", "tokens_reused", "prompt_tokens", "queue_wait_p99", "ttft_p50", "ttft_p99")


@dataclass
class FleetResult:
    flags: list[str]
    n: int
    router: str
    sees: str
    results: list[dict]  # per request, in trace order: the server's row (as `slotlab simulate` has it)
    totals: dict  # the fleet's (summary.merge_totals)
    servers: list[dict]  # per server: its number, its requests' indices count and its totals
    routing: list[dict]  # per request: {"i", "arrival", "server", "why", ...the numbers the why quotes}
    capacity: dict
    how: str
    stats: dict = field(default_factory=dict)
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"flags": self.flags, "fleet": {"servers": self.n, "router": self.router, "router_sees": self.sees,
                                               "how": self.how, **({"lockstep": self.stats} if self.stats else {})},
                **({"fleet_notes": self.notes} if self.notes else {}),
                "totals": self.totals, "servers": self.servers, "capacity": self.capacity,
                "routing": self.routing, "results": self.results}

    def warning(self) -> str | None:
        return capacity.warning(self.capacity, self.n)

    def lines(self, per_request: bool = True, limit: int | None = 50) -> list[str]:
        from slotlab.sim.simulate import SimResult

        out = [f"fleet       {self.n} server{'s' if self.n > 1 else ''} behind the {self.router} router; it sees "
               f"{self.sees}", f"            {self.how}"]
        if per_request:
            rows = self.routing if limit is None else self.routing[:limit]
            out.append(f"{'#':>5} {'server':>6}  why")
            out += [f"{r['i']:>5} {r['server']:>6}  {r['why']}" for r in rows]
            if len(rows) < len(self.routing):
                out.append(f"... {len(self.routing) - len(rows)} more (--json for all)")
        pct = lambda a, b: f"{100 * a / b:5.1f} %" if b else "    -"  # noqa: E731
        out.append(f"{'server':>6} {'requests':>8} {'reused':>8} {'q-wait p99':>10} {'TTFT p50':>9} {'TTFT p99':>9}")
        for s in self.servers:
            t = s["totals"]
            out.append(f"{s['server']:>6} {t['n_requests']:>8} {pct(t['tokens_reused'], t['prompt_tokens']):>8} "
                       f"{t['queue_wait_p99']:>10.3f} {t['ttft_p50']:>9.3f} {t['ttft_p99']:>9.3f}")
        out += SimResult(self.flags, self.results, self.totals).lines(per_request=False)
        out += [f"note: {x}" for x in self.notes]
        w = self.warning()
        if w:
            out.append(w)
        return out


def simulate_fleet(trace, flags=None, n: int = 1, router: str = "round-robin", *, speed, profile=None, vocab=None,
                   bounds: bool = False, scheduler=None, source: dict | None = None,
                   index_blocks: int | None = None, progress=None) -> FleetResult:
    """Simulate `trace` on `n` llama-servers (each under `flags`, `profile`, `speed`) behind `router`
    (`routers.ROUTERS`). `scheduler`: a Dask scheduler address or Client to run the servers on;
    `source`: how to load the trace again on a worker ({"path", "limit", "time_scale", "load_kw",
    "flags"}; without it the parts are sent pickled). `index_blocks`: the prefix router's LRU bound."""
    wall0 = time.perf_counter()
    if vocab is None:
        vocab = getattr(trace, "vocab", None)
    if isinstance(flags, str):
        flags = flags.split()
    kw = {"block": trace.block, "vocab": vocab}
    if index_blocks is not None:
        kw["index_blocks"] = index_blocks
    r = make_router(router, n, **kw)
    reqs = trace.requests
    if n > 1 and any(q.action is not None for q in reqs):
        raise ConfigError("a fleet does not route slot actions (they name one server's slot): "
                          "run such a trace with --fleet 1")
    notes = []
    if n > 1 and any(q.sequential for q in reqs):
        notes.append("requests without an arrival are sent in trace order per server: each waits for the earlier ones "
                     "sent to the same server (a client's `wait`), not for those sent elsewhere; the router decides at the "
                     "trace's arrival times (all 0), so least-loaded counts every earlier request in flight")
    setup = Setup(flags, speed, profile, vocab, bounds, source)
    stats: dict = {}
    if r.static:
        choices = [r.choose(i, q) for i, q in enumerate(reqs)]
        parts = parts_of([c.server for c in choices], n)
        runs = run_parts(trace, parts, setup, scheduler)
        how = ("static routing: the trace split up front, each server simulated on its part "
               + ("as a Dask task" if scheduler is not None else "in turn"))
    else:
        from slotlab.fleet.lockstep import route_least_loaded

        with Runner(trace, setup, scheduler) as runner:
            choices, runs, stats = route_least_loaded(trace, r, runner, speed, progress=progress)
        how = (f"lockstep (exact): {stats['server_runs']} server runs, {stats['requests_simulated']} requests "
               f"simulated for {stats['requests']} ({stats['changed_choices']} choices changed from the first guess)"
               + (", each batch of runs as Dask tasks" if scheduler is not None else ""))
    results: list[dict | None] = [None] * len(reqs)
    for run in runs:
        for row in run.results:
            results[row["i"]] = row
    wall = time.perf_counter() - wall0
    totals = merge_totals(trace, results, [x.totals for x in runs], wall)  # type: ignore[arg-type]
    servers = [{"server": x.server, "requests": len(x.indices), "wall_seconds": round(x.wall_s, 3),
                "totals": x.totals} for x in runs]
    from slotlab.engine.params import ServerParams

    n_slots = ServerParams.from_args(list(flags if flags is not None else trace.flags)).n_slots
    cap = capacity.check(trace, results, [c.server for c in choices], n, speed, n_slots)
    routing = [c.record(i, q.arrival) for i, (c, q) in enumerate(zip(choices, reqs))]
    return FleetResult(list(flags if flags is not None else trace.flags), n, r.name, r.sees, results, totals,
                       servers, routing, cap, how, stats, wall, notes)


__all__ = ["FleetResult", "ServerRun", "simulate_fleet"]
