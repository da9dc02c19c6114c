"""Running the servers' simulations: serially, or one Dask task a server.

Why a module of its own: a static router's parts are independent simulations, so they can run
anywhere; least-loaded runs the same function for each speculative part (`lockstep`). Each run is
`slotlab.sim.simulate.simulate` unchanged (fast mode, no hindsight: what `slotlab simulate` runs).

On Dask (`--scheduler tcp://HOST:PORT`, the `[dask]` extra, the client from
`slotlab.sim.whatif.dask_client`), as `whatif` does it: where the trace came from a file (`source`),
its bytes are scattered to the workers once and each task loads the trace and takes its part, so a
worker needs slotlab but not this machine's files; the profile travels as its fields. Without a
`source` (a trace built in Python), the part itself is sent (pickled)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from slotlab.fleet.split import subtrace, to_global


@dataclass
class ServerRun:
    """One server's simulation: the trace indices it got, its rows (trace numbering), its totals."""
    server: int
    indices: list[int]
    results: list[dict]
    totals: dict
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)


@dataclass
class Setup:
    """What every server runs under (the same for each): flags, speed model, profile, vocabulary."""
    flags: list[str] | None
    speed: object
    profile: object = None
    vocab: object = None
    bounds: bool = False
    source: dict | None = None  # {"path", "limit", "time_scale", "load_kw"}: how to load the trace again


def run_part(trace, idx: list[int], setup: Setup, server: int = 0) -> ServerRun:
    """Simulate one server on the requests `idx` of `trace`."""
    from slotlab.sim.simulate import simulate

    t0 = time.perf_counter()
    res = simulate(subtrace(trace, idx), setup.flags, speed=setup.speed, profile=setup.profile, vocab=setup.vocab,
                   fast=True, hindsight=False, bounds=setup.bounds and bool(idx))
    return ServerRun(server, list(idx), to_global(res.results, idx), res.totals, time.perf_counter() - t0)


def run_parts(trace, parts: list[list[int]], setup: Setup, scheduler=None) -> list[ServerRun]:
    """Every server's simulation, in server order: serially, or on the Dask scheduler at `scheduler`
    (an address, or a `dask.distributed.Client`)."""
    with Runner(trace, setup, scheduler) as run:
        return run(list(enumerate(parts)))


class Runner:
    """Runs batches of server simulations [(server, indices), ...]: here, one after the other, or as
    Dask tasks (a batch's runs in parallel). On Dask the trace's bytes are scattered once for every
    batch, and a worker keeps the trace it loaded (`_LOADED`), so the re-runs of `lockstep` and the
    servers of a fleet larger than the cluster do not load it again."""

    def __init__(self, trace, setup: Setup, scheduler=None):
        self.trace, self.setup, self.scheduler = trace, setup, scheduler
        self.client = self.data = None
        self.runs = 0

    def __enter__(self):
        if self.scheduler is not None:
            from slotlab.sim.whatif import dask_client

            self.client = dask_client(self.scheduler) if isinstance(self.scheduler, str) else self.scheduler
            from dataclasses import asdict

            prof = self.setup.profile.to_dict() if self.setup.profile is not None else None
            self.tag = f"{os.getpid()}-{time.time_ns()}"
            self.job = {"flags": self.setup.flags, "speed": asdict(self.setup.speed), "profile_dict": prof,
                        "bounds": self.setup.bounds, "source": self.setup.source, "tag": self.tag}
            if self.setup.source is not None:
                with open(self.setup.source["path"], "rb") as f:
                    self.data = self.client.scatter(f.read(), broadcast=True)
        return self

    def __exit__(self, *exc):
        if self.client is not None and isinstance(self.scheduler, str):
            self.client.close()

    def __call__(self, jobs: list[tuple[int, list[int]]]) -> list[ServerRun]:
        if self.client is None:
            return [run_part(self.trace, idx, self.setup, s) for s, idx in jobs]
        futs = []
        for s, idx in jobs:
            key = f"slotlab-fleet-{s}-{self.runs}-{self.tag}"
            self.runs += 1
            if self.data is not None:
                futs.append(self.client.submit(_task, self.job, self.data, idx, s, pure=False, key=key))
            else:  # no file to load it from: the part itself travels
                futs.append(self.client.submit(_task, self.job, subtrace(self.trace, idx), list(range(len(idx))), s,
                                               idx, pure=False, key=key))
        return [ServerRun(**f.result()) for f in futs]


#: the traces a worker loaded, by the client's tag (the last two: a worker may serve two fleets at once)
_LOADED: dict = {}


def _task(job: dict, data, idx: list[int], server: int, glob: list[int] | None = None) -> dict:
    """One server in a Dask worker: the trace loaded from its bytes (or sent as the part itself)."""
    from slotlab.sim.speed import SpeedModel

    prof = None
    if job["profile_dict"] is not None:
        from slotlab.memory.profile import ModelProfile

        prof = ModelProfile.from_json(job["profile_dict"])
    if isinstance(data, bytes):
        trace = _LOADED.get(job["tag"])
        if trace is None:
            trace = _LOADED[job["tag"]] = _load(data, job["source"])
            while len(_LOADED) > 2:
                _LOADED.pop(next(iter(_LOADED)))
    else:
        trace = data
    vocab = None
    if any(isinstance(r.prompt, str) for r in trace.requests):
        from slotlab.sim.whatif import _vocab

        vocab = _vocab(job["flags"] or trace.flags)
    setup = Setup(job["flags"], SpeedModel(**job["speed"]), prof, vocab, job["bounds"])
    run = run_part(trace, idx, setup, server)
    if glob is not None:  # the part was sent as a trace of its own: back to the trace's numbering
        run.results = [{**r, "i": glob[r["i"]]} for r in run.results]
        run.indices = list(glob)
    return run.__dict__


def _load(data: bytes, source: dict):
    """The trace from the bytes the client scattered (a file of the same name: readers tell the format
    partly by the suffix)."""
    import tempfile

    from slotlab.sim.cli import model_flag
    from slotlab.sim.traces import load_sim_trace

    with tempfile.TemporaryDirectory(prefix="slotlab-fleet-") as d:
        path = os.path.join(d, os.path.basename(source["path"]) or "trace.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        return load_sim_trace(path, limit=source.get("limit"), time_scale=source.get("time_scale", 1.0),
                              model=model_flag(source.get("flags") or []), **(source.get("load_kw") or {}))
