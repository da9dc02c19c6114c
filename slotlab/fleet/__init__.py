"""A fleet on paper: N llama-servers behind a router (`slotlab simulate TRACE --fleet N --router R`).

Why: users run several llama-servers behind a router (llama-swap, LiteLLM, nginx, or a KV-aware one
such as SGLang's router or Dynamo's KV router), and their prompt-cache hit rate depends on the
router first: a conversation's next turn is only reused if it lands on the server holding the
earlier one. Each server here IS an unchanged `slotlab.sim.simulate` run (the same flags and
profile for each), so every cache and slot decision is exactly its build's; the fleet only decides
which requests each server gets.

One concept a module:

* `keys`     what a router can read off a request (its session key, its prompt's block chain);
* `routers`  the routers (round-robin, session, prefix, least-loaded) and their per-request choice;
* `split`    a server's part of the trace, and its results mapped back to the trace's numbering;
* `servers`  running the servers' simulations, serially or as Dask tasks;
* `lockstep` least-loaded, which needs completions: exact, by speculation and verification;
* `capacity` the warning when arrivals exceed what the fleet serves, with the smallest N that would;
* `summary`  the fleet's totals (the same fields as one server's), per server and overall;
* `run`      `simulate_fleet`, tying these together; `cli` the command line.

The proof: tests/golden/record_fleet.py records real llama-servers (the pin) behind a real HTTP router
(round-robin, session, prefix, written from these definitions); tests/fleet/test_fleet_golden.py runs
the same traces here and gets, per request, the same server and that server's same decisions.
`slotlab whatif --vary "--fleet 1,2,4" --vary "--router ..."` sweeps fleets (slotlab.sim.whatif).
"""

from slotlab.fleet.routers import ROUTERS, make_router
from slotlab.fleet.run import FleetResult, simulate_fleet

__all__ = ["ROUTERS", "FleetResult", "make_router", "simulate_fleet"]
