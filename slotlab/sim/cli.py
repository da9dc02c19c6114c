"""`slotlab simulate` and `slotlab calibrate`: the command lines over slotlab.sim."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROFILES = Path(__file__).with_name("profiles")


def resolve_profile(spec: str | None):
    """A profile from a JSON or TOML file, a shipped name (`llama-3.1-8b`), a GGUF path, or None (the -m
    model's header)."""
    if spec is None:
        return None
    from slotlab.memory.profile import ModelProfile

    p = Path(spec)
    if not p.exists() and (PROFILES / f"{spec}.json").exists():
        p = PROFILES / f"{spec}.json"
    if not p.exists():
        names = ", ".join(sorted(x.stem for x in PROFILES.glob("*.json")))
        raise SystemExit(f"slotlab simulate: no profile {spec!r} (a JSON or TOML file, a GGUF, or one of: {names})")
    return ModelProfile.from_file(p)


def profile_rows(specs: list[str] | None = None, *, n_tokens: tuple[int, ...] = (8192, 32768)) -> list[dict]:
    """Per profile (the shipped ones, or `specs`: names, JSON / TOML files or GGUFs), what its memory costs
    on llama-server's default cache types (f16 K/V, f32 recurrent rows): the memory kind, K+V bytes a
    token, the SWA window, the recurrent state of one sequence, and one checkpoint (a PARTIAL_ONLY
    state of one sequence of n tokens, -np 1 -c n) for each n of `n_tokens`, computed by the paper
    memory (the code the byte-exact tests prove against the real context). A profile whose memory
    slotlab cannot size (`ModelProfile.unsized`, e.g. a GGUF of an architecture whose state it does not
    model) gets its row all the same, with `unsized` saying which architecture and what it lacks, and
    no state or checkpoint figures (None), so the other rows still print."""
    from slotlab.memory.paper import PaperMemory
    from slotlab.memory.base import Batch

    import numpy as np

    names = specs or sorted(x.stem for x in PROFILES.glob("*.json"))
    rows = []
    for spec in names:
        prof = resolve_profile(spec)
        row = {"profile": spec, "architecture": prof.architecture, "memory": prof.memory,
               "kv_bytes_per_token": None, "n_swa": prof.n_swa if prof.is_swa_model else 0,
               "recurrent_bytes_per_seq": None, "checkpoint_bytes": {}}
        if prof.unsized:  # which layers hold what is unknown too: no figure rather than a guessed one
            row["unsized"] = prof.unsized
            row["checkpoint_bytes"] = {n: None for n in n_tokens}
            rows.append(row)
            continue
        row["kv_bytes_per_token"], row["recurrent_bytes_per_seq"] = prof.bytes_per_token(), prof.rs_bytes_per_seq()
        for n in n_tokens:
            mem = PaperMemory(prof, n_ctx=n, n_slots=1)
            b = Batch(mem.n_batch)
            for p0 in range(0, n, mem.n_batch):
                k = min(mem.n_batch, n - p0)
                b.clear()
                b.add_seq(np.zeros(k, dtype=np.int32), p0, 0)
                if mem.decode(b, 0, k) != 0:
                    raise ValueError(f"{spec}: {n} tokens do not fit one sequence of -c {n}")
            row["checkpoint_bytes"][n] = mem.state_size(0, partial=True)
        rows.append(row)
    return rows


_ROWS = "\x00results\x00"  # (a string no report holds: json.dumps writes it escaped)


def json_text(doc: dict) -> str:
    """`doc` as indented JSON with each of its per-request `results` on one line: readable, and the
    rows written by the C encoder (`indent` makes json.dumps use the pure-Python one: a tenth of a
    second on 12,000 rows)."""
    rows = doc.get("results")
    if not isinstance(rows, list) or not rows:
        return json.dumps(doc, indent=1)
    text = json.dumps({**doc, "results": _ROWS}, indent=1)
    body = ",\n  ".join(json.dumps(r) for r in rows)
    return text.replace(json.dumps(_ROWS), "[\n  " + body + "\n ]", 1)


def add_speed_args(ap) -> None:
    """The speed options every simulating command takes (simulate, a fleet, whatif)."""
    from slotlab.sim.gpus import GPUS

    ap.add_argument("--speed", help="speed model JSON from `slotlab calibrate` (--url: your server's)")
    ap.add_argument("--gpu", metavar="CLASS", help="estimate the speed of the profile on one GPU of this class ("
                    + ", ".join(GPUS) + "; default: the smallest the weights fit; `slotlab profiles --speed` lists them)")
    ap.add_argument("--prefill-tps", type=float, help="prefill tokens/s of your server (with --gen-tps)")
    ap.add_argument("--gen-tps", type=float, help="generation tokens/s of one sequence")


def speed_from_args(args, profile, flags, who: str):
    """The speed model the options name: --speed, else --prefill-tps / --gen-tps, else the profile's
    estimate on --gpu (slotlab.sim.gpus), said on stderr with what it rests on, and a warning when the
    weights do not fit that GPU. `profile` None: the -m model's header (the embedded model's)."""
    from slotlab.errors import ConfigError
    from slotlab.sim import gpus
    from slotlab.sim.speed import SpeedModel

    if args.speed:
        if args.gpu:
            raise ConfigError("--speed and --gpu both name the speed: give one")
        return SpeedModel.from_json(Path(args.speed).read_text())
    if args.prefill_tps or args.gen_tps:
        if not (args.prefill_tps and args.gen_tps):
            raise ConfigError("--prefill-tps and --gen-tps go together (or give --speed, or --gpu)")
        if args.gpu:
            raise ConfigError("--prefill-tps / --gen-tps and --gpu both name the speed: give one")
        return SpeedModel.from_rates(args.prefill_tps, args.gen_tps)
    if profile is None:
        from slotlab.engine.params import ServerParams
        from slotlab.memory.profile import ModelProfile

        m = ServerParams.from_args(list(flags or [])).model if flags else None
        profile = ModelProfile.from_gguf(m) if m else ModelProfile.default()
    try:
        g = gpus.gpu(args.gpu) if args.gpu else gpus.default_gpu(profile)
        speed = gpus.speed_for(profile, g.name)
    except ValueError as ex:
        raise ConfigError(f"{who}: {ex}") from None
    print(f"{who}: speed: {speed.source} — prefill {speed.prefill_rate(2048):,.0f} tok/s (a 2048-token prompt), "
          f"generation {speed.gen_rate(1):,.1f} tok/s (--gpu, --speed or --prefill-tps / --gen-tps to change)",
          file=sys.stderr)
    note = gpus.fit_note(profile, g)
    if note:
        print(f"{who}: warning: {note}", file=sys.stderr)
    return speed


def profiles_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="slotlab profiles", description="The model profiles `slotlab simulate "
                                 "--profile` and `slotlab whatif --profile` accept, with what their memory costs.")
    ap.add_argument("profile", nargs="*", help="profiles to list (names, JSON / TOML files or GGUFs; default: the shipped ones)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--speed", action="store_true", help="instead: the estimated speed of each profile on each GPU "
                    "class (what `slotlab simulate --gpu` uses): prefill tok/s of a 2048-token prompt / generation "
                    "tok/s of one sequence, with their sources")
    args = ap.parse_args(argv)
    if args.speed:
        return _speed_table(args.profile or None, args.json)
    rows = profile_rows(args.profile or None)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    head = ("profile", "memory", "KV B/token", "SWA", "recurrent/seq", "ckpt @8k", "ckpt @32k")
    table = [head] + [(r["profile"], r["memory"], "?" if r.get("unsized") else f'{r["kv_bytes_per_token"]:,}',
                       str(r["n_swa"] or "-"),
                       "?" if r.get("unsized") else mib(r["recurrent_bytes_per_seq"]) if r["recurrent_bytes_per_seq"]
                       else "-", *("?" if r["checkpoint_bytes"][n] is None else mib(r["checkpoint_bytes"][n])
                                   for n in (8192, 32768))) for r in rows]
    w = [max(len(t[i]) for t in table) for i in range(len(head))]
    for t in table:
        print("  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(t)).rstrip())
    for r in rows:
        if r.get("unsized"):
            print(f"{r['profile']}: ? = not sized: {r['unsized']}")
    print("\nKV B/token: f16 K+V of one token in every attention layer; ckpt: one context checkpoint (a PARTIAL_ONLY "
          "state) of one sequence of 8192 / 32768 tokens (-np 1 -c N -ub 512): the whole KV cache for a full-attention "
          "model, the window cache for a SWA one, the recurrent state for a hybrid one.")
    return 0


def speed_rows(specs: list[str] | None = None) -> list[dict]:
    """Per profile (the shipped ones, or `specs`) and GPU class: the estimated prefill rate of a
    2048-token prompt, of a 512-token chunk 32k tokens deep, and generation of one sequence at depth 0
    and 32k (slotlab.sim.gpus), whether the weights fit, and the class `--gpu` defaults to."""
    from slotlab.sim import gpus

    names = specs or sorted(x.stem for x in PROFILES.glob("*.json"))
    out = []
    for n in names:
        prof = resolve_profile(n)
        total, _ = gpus.weights_bytes(prof)
        row = {"profile": n, "weights_gib": total / 2**30, "default_gpu": gpus.default_gpu(prof).name, "gpus": {}}
        for g in gpus.GPUS.values():
            sp = gpus.speed_for(prof, g.name)
            d = 32768
            row["gpus"][g.name] = {"prefill_tps": sp.prefill_rate(2048), "gen_tps": sp.gen_rate(1),
                                   "prefill_tps_32k": 512 / sp.decode_time(512, 1, 512 * d, d),
                                   "gen_tps_32k": 1 / sp.decode_time(1, 1, d, d), "fits": not gpus.fit_note(prof, g)}
        out.append(row)
    return out


def _speed_table(specs, as_json: bool) -> int:
    from slotlab.sim import gpus

    rows = speed_rows(specs)
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    names = list(gpus.GPUS)
    head = ("profile", "GiB", *names)
    table = [head]
    for r in rows:
        cells = []
        for g in names:
            x = r["gpus"][g]
            c = f'{x["prefill_tps"]:,.0f} / {x["gen_tps"]:.0f}' if x["fits"] else "-"
            cells.append(c + ("*" if g == r["default_gpu"] else ""))
        table.append((r["profile"], f'{r["weights_gib"]:.1f}', *cells))
    w = [max(len(t[i]) for t in table) for i in range(len(head))]
    for t in table:
        print("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(t)).rstrip())
    print(f"\nprefill tok/s of a 2048-token prompt / generation tok/s of one sequence, Q4_K_M weights ({gpus.QUANT_BPW} "
          "bits a weight), one GPU; - : the weights do not fit it; * : the class `slotlab simulate --gpu` defaults to "
          "(the smallest that holds them). Estimates: generation fitted to llama.cpp's measured tok/s on each class "
          f"({gpus.GEN_SOURCE}); prefill from {gpus.PREFILL_SOURCE}, scaled by active parameters and each class's "
          f"spec-sheet int8 tensor rate ({gpus.HOPPER_SOURCE}); an MoE's active weights count "
          f"{gpus.MOE_FACTOR:.2f} times. `slotlab calibrate --url` measures your own server.")
    return 0


def model_flag(flags: list[str]) -> str | None:
    """The `-m` among llama-server `flags` (None: the embedded model): a session log's tokenizer."""
    if not flags:
        return None
    from slotlab.engine.params import ServerParams

    return ServerParams.from_args(list(flags)).model


def flags_of_log(path, flags: list[str], who: str) -> list[str]:
    """The flags to run a session log under: those given, else its header's (what `slotlab proxy
    --record` kept: --flags and /props), said on stderr either way so a default is never silent."""
    from slotlab.sim.traces import session_log_header, trace_kind

    try:
        if trace_kind(Path(path)) != "sessions":
            return flags
    except Exception:  # the loader says what is wrong with the file
        return flags
    h = session_log_header(path) or {}
    if flags:
        if h.get("flags") and list(h["flags"]) != list(flags):
            print(f"{who}: note: flags given on the command line ({' '.join(flags)}), not the recorded "
                  f"{' '.join(h['flags'])}", file=sys.stderr)
        return flags
    if h.get("flags"):
        build = (h.get("server") or {}).get("build")
        print(f"{who}: the server's flags from the session log: {' '.join(h['flags'])}"
              + (f" (build {build})" if build else ""), file=sys.stderr)
        for n in h.get("notes") or []:
            print(f"{who}: note: {n}", file=sys.stderr)
        return list(h["flags"])
    print(f"{who}: note: the session log does not say the server's flags (record it with `slotlab proxy "
          f"--flags \"...\"`, or give them here, e.g. -np 2 -c 8192): simulating llama-server's defaults",
          file=sys.stderr)
    return flags


def simulate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="slotlab simulate", description="Run a request trace through llama-server's "
                                 "decisions on the paper memory (no model, nothing decoded) under a simulated clock.",
                                 epilog="Other arguments are llama-server flags (default: the trace's flags). "
                                 "Proposals (docs/proposals.md): --cache-ram-lru, -kvcpc N, --cache-disk MiB, --proposal "
                                 "NAME. A fleet (slotlab/fleet): --fleet N --router round-robin|least-loaded|session|prefix "
                                 "[--scheduler tcp://HOST:PORT] runs N such servers behind a router "
                                 "(`slotlab simulate TRACE --fleet 2 --help` lists its options).")
    ap.add_argument("trace", help="a Mooncake .jsonl, an OpenAI-messages session log .jsonl (tokenized with -m's chat "
                                  "template), or a slotlab trace .json (optional per-request arrival/output)")
    ap.add_argument("--profile", help="model profile: a JSON or TOML file, a shipped name (llama-3.1-8b) or a GGUF "
                                      "(default: the header of -m, or the embedded model)")
    add_speed_args(ap)
    ap.add_argument("--limit", type=int, help="only the first N requests")
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply the trace's arrival times")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--events", help="also write the events as JSON lines (keeps every event in memory)")
    ap.add_argument("--all", action="store_true", help="print every request (default: the first 50)")
    ap.add_argument("--no-bounds", action="store_true", help="leave out the ideal caches of the same memory "
                    "(LRU, FIFO, optimal, infinite: slotlab.ideal) printed beside a trace with block ids")
    ap.add_argument("--why", action="store_true", help="explain every miss (its cause), what the client changed "
                    "between the calls of each conversation (session logs) and what a stable client would have "
                    "reused; every flag change named and every client fix is tested by running the whole trace "
                    "again, and only those that saved tokens are printed as advice")
    args, flags = ap.parse_known_args(argv)
    from slotlab.sim.simulate import progress_bar, simulate
    from slotlab.sim.traces import load_sim_trace, trace_kind

    profile = resolve_profile(args.profile)
    kw = {}
    # (a header without a vocabulary size leaves the default range: the sizing error below names what it lacks)
    if profile is not None and profile.n_vocab and trace_kind(Path(args.trace)) == "mooncake":
        from slotlab.memory.paper import PaperVocab

        # a Mooncake prompt's ids must stay below the vocabulary's placeholders (granite-4.0-h-small's
        # 100,352 ids are fewer than the default range's 120,000)
        kw["hi"] = min(120_000, PaperVocab(profile.n_vocab).gen_lo)
    flags = flags_of_log(args.trace, flags, "slotlab simulate")
    params = None
    if flags:  # a session log renders with the server's template flags
        from slotlab.engine.params import ServerParams

        params = ServerParams.from_args(list(flags))
    trace = load_sim_trace(args.trace, limit=args.limit, time_scale=args.time_scale, model=model_flag(flags),
                           params=params, **kw)
    for note in getattr(trace, "notes", []) or []:
        print(f"note: {note}", file=sys.stderr)
    speed = speed_from_args(args, profile, flags or trace.flags, "slotlab simulate")
    vocab = None
    if any(isinstance(r.prompt, str) for r in trace.requests):  # text prompts: the model's tokenizer
        from slotlab.engine.params import ServerParams
        from slotlab.llama import Model

        vocab = Model(ServerParams.from_args(flags or trace.flags).model)
    if args.why:  # the session as sent, as a stable client would have sent it, and every change tested
        from slotlab.why.advice import progress_line
        from slotlab.why.session import analyse

        say = progress_line("slotlab simulate --why")
        sw = analyse(trace, list(flags or trace.flags), speed=speed, profile=profile, vocab=vocab, params=params,
                     progress=say)
        if say:
            print(file=sys.stderr)
        res = sw.base.result
        if args.events:
            print("slotlab simulate: note: --events is not written with --why (three runs make the analysis)",
                  file=sys.stderr)
        doc = res.as_json()
        if getattr(trace, "notes", None):
            doc["notes"] = list(trace.notes)
        doc.update(sw.as_json())
        if args.json:
            print(json_text(doc))
        else:
            print("\n".join(res.lines(limit=None if args.all else 50)))
            print("\n".join(sw.lines()))
        return 0
    res = simulate(trace, flags or None, speed=speed, profile=profile, vocab=vocab,
                   progress=progress_bar(), keep_events=bool(args.events), fast=True, hindsight=False,
                   bounds=not args.no_bounds)
    if args.events and res.engine is not None:
        res.engine.events.to_jsonl(args.events)
    doc = res.as_json()
    if getattr(trace, "notes", None):
        doc["notes"] = list(trace.notes)
    if args.json:
        print(json_text(doc))
    else:
        print("\n".join(res.lines(limit=None if args.all else 50)))
    return 0


def calibrate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="slotlab calibrate", description="Time the model through slotlab's engine on "
                                 "this machine (prompts of 1..512 tokens, a conversation 2k tokens deep, 1-4 sequences "
                                 "generating) and fit the speed model `slotlab simulate --speed` uses.",
                                 epilog="Other arguments are llama-server flags for the calibration engine (default: "
                                        "the server's defaults with -c 4096).")
    ap.add_argument("-m", "--model", help="GGUF (default: the embedded model)")
    ap.add_argument("-t", "--threads", type=int, help="threads (default: the core count)")
    ap.add_argument("-o", "--output", help="write the speed model JSON here")
    ap.add_argument("--repeats", type=int, default=5, help="requests of each kind (default 5)")
    ap.add_argument("--measurements", help="also write every recorded step as JSON here")
    ap.add_argument("--url", help="calibrate a running llama-server instead (http://HOST:PORT): its own timings of "
                                  "prompts of 64..2048 tokens and of a generation (slotlab.sim.calibrate_server)")
    args, flags = ap.parse_known_args(argv)
    if args.url:
        return _calibrate_url(args)
    from slotlab.sim.speed import calibrate

    speed, meas = calibrate(args.model, n_threads=args.threads, repeats=args.repeats, flags=flags)
    for n, t in meas["table"]:
        print(f"decode of {n:4d} tokens (one sequence): {1e3 * t:9.2f} ms  (the model's step around it: "
              f"{1e3 * speed.decode_time(n, 0):.2f} ms)")
    if meas.get("step"):
        print(f"engine generation step:                {1e3 * meas['step'][1]:9.2f} ms  (model "
              f"{1e3 * speed.decode_time(1, 1, 40, 40):9.2f} ms)")
    for k, t in meas["seqs"]:
        print(f"engine step, {k} sequences generating:  {1e3 * t:9.2f} ms  (model "
              f"{1e3 * speed.decode_time(k, k, 40 * k, 40 * k):9.2f} ms)")
    if meas.get("copy"):
        print(f"state copies: {meas['copy'][0] / 1e6:.1f} MB in {1e3 * meas['copy'][1]:.1f} ms")
    print(f"speed model: {speed.source}; prefill {speed.prefill_rate():.0f} tok/s, generation {speed.gen_rate():.1f} tok/s")
    if args.output:
        Path(args.output).write_text(speed.to_json())
    if args.measurements:
        Path(args.measurements).write_text(json.dumps(meas) + "\n")
    return 0


def _calibrate_url(args) -> int:
    """`calibrate --url`: the server's own timings, fitted (slotlab.sim.calibrate_server)."""
    from slotlab.sim.calibrate_server import calibrate_server

    tty = sys.stderr.isatty()
    say = (lambda m: print(f"\rcalibrate: {m}\033[K", end="", file=sys.stderr, flush=True)) if tty else None
    speed, meas = calibrate_server(args.url, repeats=max(1, min(args.repeats, 5)), progress=say)
    if tty:
        print(file=sys.stderr)
    for n, t in meas["prompts"]:
        print(f"prompt of {n:5d} tokens: {1e3 * t:9.2f} ms  (the model: {1e3 * speed.decode_time(n):.2f} ms)")
    print(f"generation: {1e3 * meas['generation']['seconds_per_token']:.2f} ms a token")
    print(f"speed model: {speed.source}; prefill {speed.prefill_rate():.0f} tok/s, generation {speed.gen_rate():.1f} tok/s")
    if args.output:
        Path(args.output).write_text(speed.to_json())
    if args.measurements:
        Path(args.measurements).write_text(json.dumps(meas) + "\n")
    return 0
