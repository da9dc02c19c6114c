"""`slotlab simulate TRACE --fleet N --router R [--scheduler tcp://HOST:PORT]`: the fleet's command line.

Why its own parser: `slotlab simulate`'s options are read as it reads them (the same trace loading,
profile, speed model and llama-server flags, applied to every server) and the fleet's are added;
`slotlab.cli.cmd_simulate` hands over here when one of --fleet / --router / --scheduler is given.
Wrong fleet options are one-line errors (`ConfigError`, printed by `slotlab.cli.main`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slotlab.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    from slotlab.fleet.routers import ROUTERS
    from slotlab.sim.cli import add_speed_args

    ap = argparse.ArgumentParser(prog="slotlab simulate --fleet N", description="Simulate N llama-servers (each "
                                 "under the same flags and profile, each exactly its build's decisions) behind a "
                                 "router, on the paper memory under one simulated clock.",
                                 epilog="Other arguments are llama-server flags, applied to every server.")
    ap.add_argument("trace")
    ap.add_argument("--fleet", default="1", help="the number of llama-servers (default 1)")
    ap.add_argument("--router", default="round-robin", help="how requests are routed: " + ", ".join(ROUTERS))
    ap.add_argument("--scheduler", help="a Dask scheduler (tcp://HOST:PORT) to simulate the servers on")
    ap.add_argument("--router-index-blocks", type=int, help="the prefix router's index bound, blocks a server")
    ap.add_argument("--profile")
    add_speed_args(ap)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--json", action="store_true", help="the report as JSON: totals, servers, routing, results")
    ap.add_argument("--all", action="store_true", help="print every request's routing (default: the first 50)")
    ap.add_argument("--no-bounds", action="store_true", help="leave out each server's ideal-cache bounds")
    ap.add_argument("--png", help="write the fleet's lanes (a row per server and slot, a bar per request) as a PNG")
    ap.add_argument("--html", help="the same lanes as a plotly page (the router's reason for each request on hover)")
    ap.add_argument("--why", action="store_true")
    ap.add_argument("--events")
    return ap


def fleet_args(argv: list[str]):
    """The fleet's options and the llama-server flags, checked: one-line errors for a bad fleet size,
    an unknown router, or an option a fleet does not run."""
    from slotlab.fleet.routers import ROUTERS

    args, flags = _parser().parse_known_args(argv)
    try:
        args.fleet = int(args.fleet)
    except ValueError:
        raise ConfigError(f"--fleet {args.fleet}: expected a number of servers (an integer >= 1)") from None
    if args.fleet < 1:
        raise ConfigError(f"--fleet {args.fleet}: a fleet has at least 1 server")
    if args.router not in ROUTERS:
        raise ConfigError(f"--router {args.router}: unknown router (one of: {', '.join(ROUTERS)})")
    if args.why or args.events:
        raise ConfigError(f"{'--why' if args.why else '--events'} is not run for a fleet (simulate a server's "
                          "part on its own for it)")
    return args, flags


def fleet_main(argv: list[str]) -> int:
    args, flags = fleet_args(argv)
    from slotlab.fleet.run import simulate_fleet
    from slotlab.sim.cli import flags_of_log, model_flag, resolve_profile, speed_from_args
    from slotlab.sim.traces import load_sim_trace, trace_kind

    profile = resolve_profile(args.profile)
    kw = {}
    if profile is not None and profile.n_vocab and trace_kind(Path(args.trace)) == "mooncake":
        from slotlab.memory.paper import PaperVocab

        kw["hi"] = min(120_000, PaperVocab(profile.n_vocab).gen_lo)  # as slotlab simulate loads it
    flags = flags_of_log(args.trace, flags, "slotlab simulate")
    params = None
    if flags:
        from slotlab.engine.params import ServerParams

        params = ServerParams.from_args(list(flags))
    trace = load_sim_trace(args.trace, limit=args.limit, time_scale=args.time_scale, model=model_flag(flags),
                           params=params, **kw)
    for note in trace.notes or []:
        print(f"note: {note}", file=sys.stderr)
    speed = speed_from_args(args, profile, flags or trace.flags, "slotlab simulate")
    vocab = None
    if any(isinstance(r.prompt, str) for r in trace.requests):
        from slotlab.engine.params import ServerParams
        from slotlab.llama import Model

        vocab = Model(ServerParams.from_args(flags or trace.flags).model)
    source = {"path": str(args.trace), "limit": args.limit, "time_scale": args.time_scale, "load_kw": kw,
              "flags": list(flags)}
    res = simulate_fleet(trace, flags or None, args.fleet, args.router, speed=speed, profile=profile, vocab=vocab,
                         bounds=not args.no_bounds, scheduler=args.scheduler, source=source,
                         index_blocks=args.router_index_blocks)
    w = res.warning()
    if args.json:
        doc = res.as_json()
        if trace.notes:
            doc["notes"] = list(trace.notes)
        if w:
            doc["capacity"]["warning"] = w
            print(f"slotlab simulate: {w}", file=sys.stderr)
        print(json.dumps(doc, indent=1))
    else:
        print("\n".join(res.lines(limit=None if args.all else 50)))
    if args.png or args.html:
        from slotlab.figures import fleet, write_outputs

        write_outputs(fleet, res, png=args.png, html=args.html,
                      title=f"{Path(args.trace).name}: {res.n} servers behind the {res.router} router")
    return 0
