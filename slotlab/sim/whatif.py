"""`slotlab whatif TRACE --vary "--cache-ram 0,4096,16384" --vary "-np 1,4,8"`: a grid of simulations.

Every combination of the `--vary` values is simulated on the trace (slotlab.sim.simulate, fast mode, the
paper memory: no model), in parallel (a `multiprocessing.Pool` of min(cores, runs) workers, `--jobs`, or
an existing Dask cluster, `--scheduler tcp://HOST:PORT`: `run_on_dask`; the same runs either way, in
grid order), and compared in one table: prompt tokens reused and how much of the infinite-cache bound
that is (Mooncake hash_ids), tokens prefilled, peak RAM-cache bytes, TTFT p50 / p99, errors. `--budget-mib N`
names the best setting whose RAM cache stayed within N MiB (best = lowest `--objective`, default TTFT
p50). `cache_timeline` follows one setting's RAM cache over simulated time. This module computes;
the pictures of a grid (`--html`, `--png`) are slotlab.figures.whatif's.

Other arguments are llama-server flags shared by every run (default: the trace's); a varied flag
replaces the same flag there. The model is `--profile` (a JSON profile, a shipped name such as
llama-3.1-8b, or a GGUF), the speed `--speed` JSON or `--prefill-tps` / `--gen-tps`.

A grid over fleets: `--vary "--fleet 1,2,4" --vary "--router round-robin,session,prefix"` makes each
run a fleet simulation (slotlab.fleet `simulate_fleet`: N servers under the other flags behind the
router; `fleet_flags`), its row the fleet's totals (peak RAM: the sum of the servers'); a run with
only one of the two gets a fleet of 1 or the round-robin router. `smallest_fleet` names the smallest
N whose TTFT p99 meets a target (`--ttft-target`), with the best reuse at that N.

The command line is `slotlab whatif` (slotlab.cli `cmd_whatif`)."""

from __future__ import annotations

import collections
import itertools
import os
import sys
import time
from dataclasses import asdict, dataclass, field

from slotlab.units import cache_ram_bytes

__all__ = ["WhatIfRun", "grid", "run_grid", "run_settings", "best", "table_lines", "CacheTimeline", "cache_timeline",
           "OBJECTIVES", "fleet_flags", "smallest_fleet"]

OBJECTIVES = {"ttft_p50": "TTFT p50", "ttft_p99": "TTFT p99", "prefill": "tokens prefilled"}


@dataclass
class WhatIfRun:
    setting: dict  # flag -> value, the varied ones
    flags: list
    n_requests: int = 0
    n_errors: int = 0
    prompt_tokens: int = 0
    tokens_reused: int = 0
    tokens_prefilled: int = 0
    bound_tokens: int | None = None
    peak_cache_bytes: int = 0
    ttft_p50: float = 0.0
    ttft_p99: float = 0.0
    queue_wait_p50: float = 0.0
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0
    error: str | None = None  # the run itself failed (bad flags, ...)
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join(f"{k} {v}" for k, v in self.setting.items())

    @property
    def reuse(self) -> float:
        return self.tokens_reused / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def of_bound(self) -> float | None:
        return self.tokens_reused / self.bound_tokens if self.bound_tokens else None

    def value(self, objective: str) -> float:
        return {"ttft_p50": self.ttft_p50, "ttft_p99": self.ttft_p99, "prefill": float(self.tokens_prefilled)}[objective]


def parse_vary(spec: str) -> tuple[str, list[str]]:
    """`"--cache-ram 0,4096,16384"` -> ("--cache-ram", ["0", "4096", "16384"])."""
    parts = spec.split(None, 1)
    if len(parts) != 2 or not parts[0].startswith("-"):
        raise ValueError(f"--vary {spec!r}: expected a flag and comma-separated values, e.g. \"--cache-ram 0,4096\"")
    vals = [v.strip() for v in parts[1].split(",") if v.strip()]
    if not vals:
        raise ValueError(f"--vary {spec!r}: no values")
    return parts[0], vals


def _with_flag(flags: list[str], flag: str, value: str) -> list[str]:
    """`flags` with `flag value` replacing any occurrence of `flag` (and its value)."""
    out, i = [], 0
    while i < len(flags):
        if flags[i] == flag:
            i += 2 if i + 1 < len(flags) and not (flags[i + 1].startswith("-") and not _is_number(flags[i + 1])) else 1
            continue
        out.append(flags[i])
        i += 1
    return out + [flag, value]


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def grid(base: list[str], varies: list[tuple[str, list[str]]]) -> list[tuple[dict, list[str]]]:
    """Every combination: (setting, flags)."""
    out = []
    for combo in itertools.product(*[vals for _, vals in varies]):
        flags = list(base)
        setting = {}
        for (flag, _), v in zip(varies, combo):
            flags = _with_flag(flags, flag, v)
            setting[flag] = v
        out.append((setting, flags))
    return out


def _run_one(job: dict, trace_bytes: bytes | None = None) -> dict:
    """One simulation (in a worker): the trace is loaded here, so only paths and numbers travel; on a
    Dask cluster (whose workers may not see this machine's files) the trace's bytes and the profile's
    fields travel instead (`trace_bytes`, `job["profile_dict"]`)."""
    from slotlab.sim.cli import model_flag, resolve_profile
    from slotlab.sim.simulate import simulate
    from slotlab.sim.speed import SpeedModel
    from slotlab.sim.traces import load_sim_trace

    run = WhatIfRun(job["setting"], job["flags"])
    t0 = time.perf_counter()
    try:
        fleet, flags = fleet_flags(job["flags"])  # the fleet's options are not llama-server flags
        if trace_bytes is not None:
            trace = _load_from_bytes(trace_bytes, {**job, "flags": flags})
        else:
            trace = load_sim_trace(job["trace"], limit=job.get("limit"), time_scale=job["time_scale"],
                                   model=model_flag(flags))
        speed = SpeedModel(**job["speed"])
        if job.get("profile_dict") is not None:
            from slotlab.memory.profile import ModelProfile

            profile = ModelProfile.from_json(job["profile_dict"])
        else:
            profile = resolve_profile(job.get("profile"))
        vocab = None
        if any(isinstance(r.prompt, str) for r in trace.requests):  # text prompts: the model's tokenizer
            vocab = _vocab(flags or trace.flags)
        if fleet is not None:  # N servers behind a router: slotlab.fleet, the other flags on every server
            from slotlab.fleet import simulate_fleet

            res = simulate_fleet(trace, flags or None, fleet[0], fleet[1], speed=speed, profile=profile,
                                 vocab=vocab, bounds=bool(job.get("bounds")) and fleet[0] == 1)
            run.extra["fleet"] = {"servers": fleet[0], "router": fleet[1],
                                  "capacity_warning": res.warning(), "how": res.how}
        else:
            res = simulate(trace, job["flags"], speed=speed, profile=profile, vocab=vocab,
                           hindsight=False, bounds=bool(job.get("bounds")))  # no "why" is read
        t = res.totals
        run.n_requests, run.n_errors = t["n_requests"], t["n_errors"]
        run.prompt_tokens, run.tokens_reused, run.tokens_prefilled = t["prompt_tokens"], t["tokens_reused"], t["tokens_prefilled"]
        run.bound_tokens = t.get("infinite_cache_tokens")
        run.peak_cache_bytes = t["peak_cache_bytes"]
        run.ttft_p50, run.ttft_p99, run.queue_wait_p50 = t["ttft_p50"], t["ttft_p99"], t["queue_wait_p50"]
        run.sim_seconds = t["sim_seconds"]
        run.extra.update({"evictions": t["evictions"], "disk_read_bytes": t.get("disk_read_bytes", 0)})
        if t.get("bounds") is not None:
            run.extra["bounds"] = t["bounds"]
        run.extra["errors"] = dict(collections.Counter(f"{d['status']} {d['error']}" for d in res.results
                                                       if d["status"] != 200))  # what the failed requests got
        res.engine = None
    except (Exception, SystemExit) as ex:  # noqa: BLE001 - one bad setting must not stop the grid
        run.error = f"{type(ex).__name__}: {ex}"
    run.wall_seconds = time.perf_counter() - t0
    return asdict(run)


#: the fleet's options in a grid's flags (`--vary "--fleet 1,2,4" --vary "--router session,prefix"`)
FLEET_FLAGS = ("--fleet", "--router")


def fleet_flags(flags: list[str]) -> tuple[tuple[int, str] | None, list[str]]:
    """((servers, router), the other flags) where `flags` carry --fleet or --router (a fleet of 1 or
    the round-robin router where only the other is given), else (None, flags). A bad fleet size or
    router is a ConfigError, reported as that run's error."""
    if not any(f in flags for f in FLEET_FLAGS):
        return None, list(flags)
    from slotlab.errors import ConfigError
    from slotlab.fleet.routers import ROUTERS

    got, rest, i = {"--fleet": "1", "--router": "round-robin"}, [], 0
    while i < len(flags):
        if flags[i] in FLEET_FLAGS and i + 1 < len(flags):
            got[flags[i]] = flags[i + 1]
            i += 2
            continue
        rest.append(flags[i])
        i += 1
    try:
        n = int(got["--fleet"])
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--fleet {got['--fleet']}: expected a number of servers (an integer >= 1)")
    if got["--router"] not in ROUTERS:
        raise ConfigError(f"--router {got['--router']}: unknown router (one of: {', '.join(ROUTERS)})")
    return (n, got["--router"]), rest


def smallest_fleet(runs: list[WhatIfRun], ttft_target: float) -> WhatIfRun | None:
    """The fleet runs whose TTFT p99 meets `ttft_target` (seconds), among those that ran and served a
    request (as `best`: a refused request has no TTFT; the table shows the errors): the smallest N
    among them, and at that N the router with the best reuse (ties: lower p99). None when no fleet
    run meets it."""
    ok = [r for r in runs if r.error is None and "fleet" in r.extra and r.n_errors < r.n_requests
          and r.ttft_p99 <= ttft_target]
    if not ok:
        return None
    return min(ok, key=lambda r: (r.extra["fleet"]["servers"], -r.reuse, r.ttft_p99))


_VOCABS: dict = {}


def _vocab(flags: list[str]):
    """The tokenizer of the model `flags` name (-m, or the default model), once per worker process: a
    trace with text prompts (a slotlab .json trace) needs it as `slotlab simulate` does."""
    from slotlab.engine.params import ServerParams
    from slotlab.llama import Model

    path = ServerParams.from_args(list(flags)).model
    if path not in _VOCABS:
        _VOCABS[path] = Model(path)
    return _VOCABS[path]


def _load_from_bytes(data: bytes, job: dict):
    """The trace of a Dask job, from the bytes the client sent (written to a file of the same name, as
    the readers tell a trace's format partly by its suffix)."""
    import tempfile

    from slotlab.sim.cli import model_flag
    from slotlab.sim.traces import load_sim_trace

    with tempfile.TemporaryDirectory(prefix="slotlab-whatif-") as d:
        path = os.path.join(d, os.path.basename(job["trace"]) or "trace.jsonl")
        with open(path, "wb") as f:
            f.write(data)
        return load_sim_trace(path, limit=job.get("limit"), time_scale=job["time_scale"],
                              model=model_flag(job["flags"]))


def _check_profile(profile: str | None):
    """The grid's profile, resolved (None: none given). One that cannot be read or sized fails the
    whole grid once, with its own message, instead of every run with the same one."""
    if profile is None:
        return None
    from slotlab.errors import ModelError
    from slotlab.sim.cli import resolve_profile

    prof = resolve_profile(profile)
    if prof.unsized:
        raise ModelError(prof.unsized)
    return prof


def dask_client(address: str):
    """A `dask.distributed.Client` connected to the scheduler at `address` (tcp://HOST:PORT); a clear
    error when dask is not installed (it is the optional extra `slotlab[dask]`) or nothing answers."""
    from slotlab.errors import ConfigError

    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError(f"--scheduler {address}: dask.distributed is not installed "
                          "(pip install 'slotlab[dask]', or 'dask[distributed]')") from None
    try:
        return Client(address, timeout="10s")
    except (OSError, TimeoutError) as ex:
        raise ConfigError(f"--scheduler {address}: cannot reach a Dask scheduler there ({ex})") from None


def run_on_dask(job_list: list[dict], trace: str, client, progress=None) -> list[dict]:
    """The grid's jobs on a Dask cluster: the trace's bytes scattered to every worker once, one task a
    run (`submit`), results collected as they finish (`as_completed`: the progress bar moves with the
    fastest run) and returned in grid order. The workers need slotlab installed (the same version); the
    profile travels as its fields, so a profile file on this machine is enough."""
    from dask.distributed import as_completed

    with open(trace, "rb") as f:
        data = client.scatter(f.read(), broadcast=True)
    futures = [client.submit(_run_one, j, data, pure=False, key=f"slotlab-whatif-{i}-{os.getpid()}-{time.time_ns()}")
               for i, j in enumerate(job_list)]
    index = {f.key: i for i, f in enumerate(futures)}
    out: list[dict | None] = [None] * len(futures)
    done = 0
    for fut in as_completed(futures):
        out[index[fut.key]] = fut.result()
        done += 1
        if progress:
            progress(done, len(futures))
    return out  # type: ignore[return-value]


def run_grid(trace: str, base: list[str], varies, *, speed, profile: str | None = None, limit: int | None = None,
             time_scale: float = 1.0, jobs: int | None = None, progress=None, scheduler=None) -> list[WhatIfRun]:
    """Simulate every setting of the grid; results in grid order. `scheduler`: a Dask scheduler's
    address (tcp://HOST:PORT) or a `dask.distributed.Client` to run the grid on instead of local
    processes (`jobs` is then the cluster's business)."""
    return run_settings(trace, grid(base, varies), speed=speed, profile=profile, limit=limit, time_scale=time_scale,
                        jobs=jobs, progress=progress, scheduler=scheduler)


def run_settings(trace: str, settings: list[tuple[dict, list[str]]], *, speed, profile: str | None = None,
                 limit: int | None = None, time_scale: float = 1.0, jobs: int | None = None, progress=None,
                 scheduler=None, bounds_first: bool = False) -> list[WhatIfRun]:
    """Simulate each (setting, flags) as `run_grid` does; `bounds_first`: the first run also computes
    the ideal caches' bounds at its memory (slotlab.ideal, in `extra["bounds"]`)."""
    prof = _check_profile(profile)
    job_list = [{"setting": s, "flags": f, "trace": str(trace), "limit": limit, "time_scale": time_scale,
                 "profile": profile, "speed": {k: v for k, v in asdict(speed).items()},
                 "bounds": bounds_first and i == 0} for i, (s, f) in enumerate(settings)]
    n = len(job_list)
    if scheduler is not None:
        if prof is not None:
            d = prof.to_dict()
            for j in job_list:
                j["profile_dict"] = d
        client = dask_client(scheduler) if isinstance(scheduler, str) else scheduler
        try:
            return [WhatIfRun(**d) for d in run_on_dask(job_list, str(trace), client, progress)]
        finally:
            if isinstance(scheduler, str):
                client.close()
    workers = max(1, min(jobs or os.cpu_count() or 1, n))
    out: list[dict] = []
    if workers == 1:
        for j in job_list:
            out.append(_run_one(j))
            if progress:
                progress(len(out), n)
    else:
        import multiprocessing as mp

        with mp.get_context("fork" if sys.platform != "win32" else "spawn").Pool(workers) as pool:
            for d in pool.imap(_run_one, job_list):
                out.append(d)
                if progress:
                    progress(len(out), n)
    return [WhatIfRun(**d) for d in out]


def best(runs: list[WhatIfRun], budget_mib: float | None, objective: str = "ttft_p50") -> WhatIfRun | None:
    """The run with the lowest `objective` among those that ran, served every request and kept the RAM
    cache within `budget_mib` (None: no budget); ties go to less RAM."""
    ok = [r for r in runs if r.error is None and r.n_errors < r.n_requests
          and (budget_mib is None or r.peak_cache_bytes <= budget_mib * 2**20)]
    if not ok:
        return None
    return min(ok, key=lambda r: (r.value(objective), r.peak_cache_bytes, -r.tokens_reused))


def table_lines(runs: list[WhatIfRun]) -> list[str]:
    w = max([len(r.label) for r in runs] + [7])
    head = (f"{'setting':<{w}} {'reused':>7} {'of bound':>8} {'prefilled':>11} {'peak RAM':>10} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'errors':>6} {'wall':>6}")
    out = [head, "-" * len(head)]
    for r in runs:
        if r.error:
            out.append(f"{r.label:<{w}} failed: {r.error}")
            continue
        ob = f"{100 * r.of_bound:.1f} %" if r.of_bound is not None else "-"
        out.append(f"{r.label:<{w}} {100 * r.reuse:>5.1f} % {ob:>8} {r.tokens_prefilled:>11,} "
                   f"{r.peak_cache_bytes / 2**20:>6.0f} MiB {r.ttft_p50:>8.2f}s {r.ttft_p99:>8.2f}s {r.n_errors:>6} "
                   f"{r.wall_seconds:>5.1f}s")
    if runs and runs[0].bound_tokens:
        r0 = runs[0]
        out.append(f"bound: an infinite prefix cache could reuse {r0.bound_tokens:,} of {r0.prompt_tokens:,} prompt "
                   f"tokens ({100 * r0.bound_tokens / r0.prompt_tokens:.1f} %); 'of bound' = reused / that")
    out += build_lines(runs)
    return out


def build_lines(runs: list[WhatIfRun]) -> list[str]:
    """Where `--server-build` is varied: per build, what it reuses against the first build's run with
    the same other settings ("should I upgrade", as a number), in percentage points of the prompt
    tokens and in tokens prefilled."""
    key = "--server-build"
    ok = [r for r in runs if not r.error and key in r.setting]
    groups: dict = {}
    for r in ok:
        rest = tuple((k, v) for k, v in r.setting.items() if k != key)
        groups.setdefault(rest, []).append(r)
    out = []
    for rest, rs in groups.items():
        base = rs[0]
        where = f" ({' '.join(f'{k} {v}' for k, v in rest)})" if rest else ""
        for r in rs[1:]:
            d = 100 * (r.reuse - base.reuse)
            fewer = base.tokens_prefilled - r.tokens_prefilled
            than = f"b{base.setting[key]}{where}"
            verdict = (f"would reuse {d:.1f} percentage points more of the prompt tokens ({fewer:,} tokens fewer to "
                       f"prefill) than {than}" if fewer > 0 else
                       f"would reuse {-d:.1f} percentage points less ({-fewer:,} tokens more to prefill) than {than}"
                       if fewer < 0 else f"would prefill the same tokens as {than}")
            out.append(f"build: on this traffic b{r.setting[key]} {verdict}")
    return out


@dataclass
class CacheTimeline:
    """The bytes one setting's RAM cache held over simulated time (`cache_timeline`)."""
    label: str
    flags: list
    limit_bytes: int | None  # --cache-ram in bytes; None: no byte limit (-1) or no cache (0)
    t: list  # simulated seconds of each cache_alloc / cache_evict, in event order
    held: list  # bytes the cache held just after it
    saves: list  # (t, n_tokens, bytes) of each cache_alloc
    evictions: list  # (t, reason, n_tokens, bytes) of each cache_evict
    totals: dict  # simulate()'s totals for the run

    @property
    def peak(self) -> int:
        return max(self.held, default=0)

    def evicted(self, reason: str | None = None) -> int:
        return sum(1 for e in self.evictions if reason is None or e[1] == reason)


def cache_timeline(trace, flags: list[str], *, speed, profile: str | None = None, limit: int | None = None,
                   time_scale: float = 1.0, label: str | None = None) -> CacheTimeline:
    """Simulate `trace` under `flags` (as one whatif run) and follow the RAM cache: the bytes it holds
    after each `cache_alloc` (+ its size) and `cache_evict` (- the size it was cached with; its reason).

    The events carry wall-clock times, not simulated ones, so each cache event gets the simulated time of
    the task launch it belongs to: the server saves idle slots, makes room and loads entries while it
    selects a slot for a new task, before `task_launched`, all in one step (one clock value). The n-th
    `task_launched` is the n-th launch in simulated time (the clock never goes back; a request's launch is
    its arrival + queue wait), so a cache event gets the time of the next launch (the last one for any
    event after it)."""
    from slotlab.engine import event_types as T
    from slotlab.sim.cli import model_flag, resolve_profile
    from slotlab.sim.simulate import simulate
    from slotlab.sim.traces import load_sim_trace

    tr = load_sim_trace(trace, limit=limit, time_scale=time_scale, model=model_flag(flags))
    seen: list[tuple] = []  # (launches before it, kind, payload) of the cache events
    launches = [0]

    def listen(ev) -> None:
        if ev.kind == T.TASK_LAUNCHED:
            launches[0] += 1
        elif ev.kind in (T.CACHE_ALLOC, T.CACHE_EVICT):
            seen.append((launches[0], ev.kind, ev.payload))

    res = simulate(tr, list(flags), speed=speed, profile=resolve_profile(profile), listen=listen, hindsight=False)
    at = sorted(r["arrival"] + r["queue_wait"] for r in res.results if r["queue_wait"] is not None)
    if len(at) != launches[0]:
        raise RuntimeError(f"{launches[0]} task launches for {len(at)} launched requests: cannot time the cache")
    cache_ram = res.engine.params.cache_ram
    limit_bytes = cache_ram_bytes(cache_ram) if cache_ram > 0 else None
    res.engine = None
    held, ts, hs, saves, evictions = 0, [], [], [], []
    size_of: dict[int, int] = {}  # entry id -> its bytes when cached (a loaded entry's are freed before its event)
    for k, kind, d in seen:
        t = round(at[min(k, len(at) - 1)], 6) if at else 0.0
        if kind == T.CACHE_ALLOC:
            size_of[d.entry_id] = d.size
            held += d.size
            saves.append((t, d.n_tokens, d.size))
        else:
            size = size_of.pop(d.entry_id, d.size)
            held -= size
            evictions.append((t, d.reason, d.n_tokens, size))
        ts.append(t)
        hs.append(held)
    return CacheTimeline(label or " ".join(flags), list(flags), limit_bytes, ts, hs, saves, evictions, res.totals)
