"""`slotlab` on the command line: `slotlab info [llama-server flags]`, `slotlab lab`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from slotlab.errors import SlotlabError

ROOT = Path(__file__).resolve().parent.parent


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def cmd_info(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        from slotlab.engine.flags import FLAGS

        print("usage: slotlab info [--json] [llama-server flags]\n\nPrints the model, context and slot "
              "configuration these flags give, and the build's capabilities.\nFlags understood: "
              + " ".join(sorted(FLAGS)))
        return 0
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    from slotlab.engine.backend import load
    from slotlab.engine.params import ServerParams

    b = load(ServerParams.from_args(argv))
    d = b.describe()
    if as_json:
        print(json.dumps(d, indent=1))
        return 0
    m, c, s, mem, cache = d["model"], d["context"], d["slots"], d["memory"], d["cache"]
    yes = lambda v: "yes" if v else "no"  # noqa: E731
    ram = {-1: "no byte limit", 0: "off"}.get(cache["cache_ram_mib"], f"{cache['cache_ram_mib']} MiB")
    lines = [
        f"slotlab {d['slotlab']} on llama-cpp-python {d['llama_cpp_python']}, modelling llama-server of llama.cpp "
        f"b{d['llama_cpp_build']} (commit {d['llama_cpp_commit']})",
        f"model      {Path(m['path']).name}: {m['desc']}, {m['n_params'] / 1e6:.1f} M params, {_mib(m['size_bytes'])}",
        f"           {m['path']}",
        f"           architecture {m['architecture']}, n_ctx_train {m['n_ctx_train']}, n_swa {m['n_swa']}, "
        f"n_layer {m['n_layer']}, n_vocab {m['n_vocab']}, add_bos {yes(m['add_bos'])}",
        f"build      GPU offload available: {yes(d['build']['gpu_offload'])}; n_gpu_layers {m['n_gpu_layers']}; "
        f"repack {'off (--no-repack)' if m['no_repack'] else 'on'}",
        f"context    n_ctx {c['n_ctx']}, n_ctx_seq {c['n_ctx_seq']}, n_batch {c['n_batch']}, n_ubatch {c['n_ubatch']}, "
        f"threads {c['n_threads']}/{c['n_threads_batch']}",
        f"slots      {s['n_slots']}{' (auto -np)' if s['auto'] else ''}, kv_unified {str(s['kv_unified']).lower()}, "
        f"n_ctx_slot {s['n_ctx_slot']}",
        f"memory     swa_full {str(mem['swa_full']).lower()}, n_swa {mem['n_swa']}, can_shift {str(mem['can_shift']).lower()}, "
        f"seq_rm {mem['seq_rm_type']}, context checkpoints {'needed' if mem['needs_checkpoints'] else 'not needed'}"
        + (f" (one checkpoint of a 1-token sequence: {mem['checkpoint_bytes_1'] / 2**20:.2f} MiB)"
           if mem["needs_checkpoints"] and mem.get("checkpoint_bytes_1", 0) > 0 else ""),
        f"cache      --cache-ram {ram}, -sps {cache['slot_prompt_similarity']:.2f}, idle slots "
        + ("saved" + (" and cleared" if s["kv_unified"] else "") if cache["cache_idle_slots"] else "not cached")
        + f", --cache-reuse {cache['cache_reuse']}"
        + ("" if mem["can_shift"] or not cache["cache_reuse"] else " (not supported by this context: ignored)")
        + f", --ctx-checkpoints {cache['ctx_checkpoints']}, -cms {cache['checkpoint_min_step']}",
    ]
    print("\n".join(lines))
    b.close()
    return 0


def lab_command(port: int | None = None, no_browser: bool = False, extra: list[str] | None = None) -> tuple[list[str], dict]:
    """The JupyterLab command line and environment: notebooks/ as root, settings and workspaces in lab/."""
    lab = ROOT / "lab"
    env = dict(os.environ)
    env["JUPYTERLAB_SETTINGS_DIR"] = str(lab / "user-settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(lab / "workspaces")
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which("jupyter")
    if jupyter is None:
        raise SlotlabError("jupyter is not installed in this environment: run `make lab` (or pip install jupyterlab)")
    cmd = [jupyter, "lab", f"--ServerApp.root_dir={ROOT / 'notebooks'}"]
    if port:
        cmd.append(f"--port={port}")
    if no_browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI machines run as root
    return cmd + list(extra or []), env


def cmd_lab(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="slotlab lab", description="Start JupyterLab on the slotlab notebooks.")
    ap.add_argument("--port", type=int)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    args, extra = ap.parse_known_args(argv)
    from slotlab.llama.model import default_model_path

    print(f"default model: {default_model_path()}")
    cmd, env = lab_command(args.port, args.no_browser, extra)
    if args.dry_run:
        print(" ".join(cmd))
        print(f"JUPYTERLAB_SETTINGS_DIR={env['JUPYTERLAB_SETTINGS_DIR']}")
        print(f"JUPYTERLAB_WORKSPACES_DIR={env['JUPYTERLAB_WORKSPACES_DIR']}")
        return 0
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover


def cmd_replay(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="slotlab replay", description="Replay a request trace the way llama-server "
                                 "would serve it and report each request's slot and cache reuse.")
    ap.add_argument("trace", help="trace JSON: {\"flags\": [...], \"requests\": [...]}")
    ap.add_argument("-m", "--model", help="GGUF model (default: the embedded Gemma 3 270M)")
    ap.add_argument("--json", action="store_true", help="print the golden-trace JSON schema")
    ap.add_argument("--events", help="also write every engine event as JSON lines to this file")
    ap.add_argument("--why", action="store_true", help="explain every miss (a request that reused less than the "
                    "server held for it): where the prompt differed, which mechanism lost the rest, and the flag "
                    "changes that would have saved it: every one that acts on the mechanism is tried by replaying "
                    "the trace up to that request, and only those that reused more are suggested, best first")
    ap.add_argument("--max-misses", type=int, default=20, help="with --why: how many misses get counterfactuals "
                    "(a miss past them gets no flag advice: nothing confirmed it)")
    ap.add_argument("--memory", choices=("real", "paper"), default="real", help="paper: the paper memory (sizes "
                    "from the GGUF header, nothing decoded, placeholder tokens generated; the model is loaded for "
                    "its vocabulary only)")
    ap.add_argument("--counterfactuals", choices=("paper", "real"), default="paper", help="with --why: where the "
                    "flag changes are replayed (default paper: the paper memory, for every memory kind, each request "
                    "generating what it generated in the replay; real: the real model, slower)")
    args = ap.parse_args(argv)
    from slotlab.engine.replay import load_trace, replay

    trace = load_trace(args.trace)
    if args.model:
        trace.flags = [*trace.flags, "-m", args.model]
    tty = sys.stderr.isatty()

    def progress(i: int, n: int) -> None:
        bar = "#" * (30 * i // n)
        print(f"\rreplaying {i:4d}/{n} [{bar:<30}]", end="" if i < n else "\n", file=sys.stderr, flush=True) \
            if tty or i == n else None

    if args.why:
        from slotlab.counterfactual import diagnose_trace, paper_replayer

        replayer = None
        if args.memory == "paper":  # the counterfactuals on the paper memory too: fast, nothing decoded
            from slotlab.engine.params import ServerParams
            from slotlab.engine.replay import resolve_flags
            from slotlab.llama import Model

            replayer = paper_replayer(trace, vocab=Model(ServerParams.from_args(resolve_flags(trace.flags)).model))
        cf = args.counterfactuals if replayer is None or args.counterfactuals == "real" else None  # None: as replayed
        diag = diagnose_trace(trace, max_misses=args.max_misses, replayer=replayer, counterfactuals=cf,
                              progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        if args.json:
            print(json.dumps(diag.as_json(), indent=1, ensure_ascii=False))
        else:
            print("\n".join(diag.lines()))
        return 0
    # --events: each miss's cause rides the stream as a request_miss event (the explainer, a view)
    from slotlab import explain

    observers = (explain.attach,) if args.events else ()
    if args.memory == "paper":
        from slotlab.engine.params import ServerParams
        from slotlab.engine.replay import resolve_flags
        from slotlab.llama import Model
        from slotlab.sim.paper_replay import replay_on_paper

        vocab = Model(ServerParams.from_args(resolve_flags(trace.flags)).model)
        out = replay_on_paper(trace, model=vocab, progress=progress, observers=observers)
    else:
        out = replay(trace, progress=progress, observers=observers)
    eng = out.pop("engine")
    out.pop("tasks")
    if args.events:
        eng.events.to_jsonl(args.events)
    if args.json:
        print(json.dumps(out, indent=1, ensure_ascii=False))
        return 0
    print(f"{'#':>3} {'kind':<8} {'slot':>4} {'status':>6} {'cached':>7} {'prefill':>7} {'tokens':>7}  detail")
    for i, (req, r) in enumerate(zip(trace.requests, out["results"])):
        if "action" in r:
            rep = r["reply"]
            det = rep.get("error", {}).get("message") if r["status"] != 200 else json.dumps(
                {k: v for k, v in rep.items() if k not in ("timings", "id_slot")})
            print(f"{i:>3} {r['action']:<8} {req['id_slot']:>4} {r['status']:>6} {'':>7} {'':>7} {'':>7}  {det}")
        elif r["status"] != 200:
            print(f"{i:>3} {'request':<8} {'-':>4} {r['status']:>6} {'':>7} {'':>7} {'':>7}  {r['error']['message']}")
        else:
            print(f"{i:>3} {'request':<8} {r['id_slot']:>4} {r['status']:>6} {r['cache_n']:>7} {r['prompt_n']:>7} "
                  f"{r['tokens_evaluated']:>7}  {req['prompt'][:40]!r}")
    m = eng.metrics
    print(f"prompt tokens: {m.prompt_tokens_cached_total} reused from cache, {m.prompt_tokens_total} processed; "
          f"hit rate {m.hit_rate:.1%}")
    eng.close()
    return 0


def cmd_serve(argv: list[str]) -> int:
    """`slotlab serve [llama-server flags]`: the same command line as llama-server."""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: slotlab serve [llama-server flags]  (e.g. -m MODEL --host 127.0.0.1 --port 8080 -np 4 "
              "--cache-ram 8192 --slot-save-path DIR --metrics --api-key KEY)\n\nEvery option of the pinned "
              "llama.cpp's llama-server is accepted, and its LLAMA_ARG_* environment variables are read; flags "
              "of features slotlab does not model are listed at start with what answers not_supported_error.")
        return 0
    from slotlab.engine.params import ServerParams
    from slotlab.engine.scheduler import Engine
    from slotlab.serve import build_app
    from slotlab.serve.gcp import GcpParams
    from slotlab.serve.listen import bind_all, run_uvicorn

    params = ServerParams.from_args(argv, env=os.environ)  # LLAMA_ARG_* as llama-server reads them
    for note in params.notes:
        print(f"slotlab: note: {note}", file=sys.stderr)
    for line in params.unsupported_notes():
        print(f"slotlab: not supported: {line}", file=sys.stderr)
    if params.n_gpu_layers != 0:
        from slotlab.llama import supports_gpu_offload

        if not supports_gpu_offload():  # llama-server warns and runs on the CPU (arg.cpp -ngl)
            print("warning: no usable GPU found, --gpu-layers option will be ignored", file=sys.stderr)
            params = params.replace(n_gpu_layers=0)
    eng = Engine(params)
    log = _serve_log(params, eng)
    eng.start()
    port = params.port
    gcp = GcpParams()
    if gcp.enabled:  # server_http_context::init: AIP_HTTP_PORT wins over --port
        log.srv_line("TRC", "init", f"Google Cloud Platform compat: health route = {gcp.path_health}, predict route "
                     f"= {gcp.path_predict}, port = {gcp.port}")
        if port != gcp.port:
            log.srv_line("WRN", "init", f"Google Cloud Platform compat: overriding server port {port} with "
                         f"AIP_HTTP_PORT {gcp.port}")
        port = gcp.port
    try:  # every --host address, as llama-server listens (slotlab/serve/listen.py)
        socks, addresses = bind_all(params.hostnames, port)
    except BaseException:
        eng.stop()
        raise
    print(f"slotlab serve: {len(eng.slots)} slots, n_ctx_slot {eng.n_ctx_slot}, listening on "
          f"{', '.join(addresses)}", file=sys.stderr, flush=True)
    for address in addresses:
        log.srv_line("INF", "llama_server", f"listening on {address}")
    level = "info" if params.verbosity >= 4 else "warning"
    try:
        run_uvicorn(build_app(eng), socks, log_level=level)
    finally:
        eng.stop()
        log.out.close()
    return 0


class _LogOut:
    """Where the server's log goes: stderr, and the --log-file too when one is given (common_log
    prints every entry to the console and to its file)."""

    def __init__(self, *files):
        self.files = files

    def write(self, text: str) -> None:
        for f in self.files:
            f.write(text)

    def flush(self) -> None:
        for f in self.files:
            f.flush()

    def close(self) -> None:
        for f in self.files:
            if f not in (sys.stderr, sys.stdout):
                f.close()


def _serve_log(params, eng):
    """The server's log lines (the format `slotlab watch --log` reads, as slotlab.watch.serve_log
    prints them) at the -lv threshold, on stderr as llama-server prints them and, with --log-file, in
    that file too (truncated first, like common_log_set_file). Lines the engine has no event for are
    written here: the start-up lines, `model loaded`, `listening on`."""
    from slotlab.watch.serve_log import LogWriter, startup_lines

    from slotlab.errors import ConfigError

    files = [sys.stderr]
    if params.log_file:
        try:
            files.append(open(params.log_file, "w", encoding="utf-8"))
        except OSError as e:
            raise ConfigError(f"--log-file: cannot open {params.log_file!r}: {e.strerror}") from None
    w = LogWriter(_LogOut(*files), verbosity=params.verbosity)
    startup_lines(w, eng)
    if params.cache_idle_slots_effective:  # server_context::init (server-context.cpp)
        unified = bool(getattr(eng.params, "kv_unified", False))
        for ev in eng.events.log:
            if ev.kind == "init":
                unified = bool(ev.payload.kv_unified)
        w.srv_line("TRC", "init", "idle slots will be saved to prompt cache"
                   + (" and cleared upon starting a new task" if unified else " upon starting a new task"))
        w.srv_line("DBG", "init", "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")
    eng.events.subscribe(w.event)
    w.srv_line("INF", "llama_server", "model loaded")
    return w


def cmd_watch(argv: list[str]) -> int:
    """`slotlab watch --log FILE` (a finished log), `--follow` / `--url` (live), `-- llama-server ARGS...`
    (start the server as a child and read its output), `--twin` (slotlab beside it, through a proxy)."""
    command = None
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="slotlab watch", description="Read a llama-server log (-lv 4 shows every "
                                 "decision) as slotlab events and report each request as `slotlab replay` does; "
                                 "live with --follow, --url or `-- llama-server ARGS...`.",
                                 usage="slotlab watch [--log FILE] [--follow] [--url URL] [--api-key K] [--twin] "
                                       "[--json] [--events F] [-- llama-server ARGS...]")
    ap.add_argument("--log", help="the server's log: its stderr / stdout, or a --log-file (with `-- cmd`: where the "
                                  "child's output is written too)")
    ap.add_argument("--follow", "-f", action="store_true", help="follow the log live (tail -F: survives rotation)")
    ap.add_argument("--from-end", action="store_true", help="with --follow: skip what the log holds already")
    ap.add_argument("--url", help="the server (http://HOST:PORT): /props, /slots, /metrics are polled")
    ap.add_argument("--api-key", help="the server's --api-key (for the polls and the twin's proxy)")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between polls (default 1)")
    ap.add_argument("--restarts", type=int, default=0, help="with `-- cmd`: restart the server this many times "
                                                            "when it dies")
    ap.add_argument("--duration", type=float, help="stop watching after this many seconds (default: Ctrl-C)")
    ap.add_argument("--twin", action="store_true", help="run slotlab's engine on the requests a proxy in front of "
                                                        "--url sees, and report the first decision that differs")
    ap.add_argument("--proxy-port", type=int, help="the recording proxy's port (default: a free one); with --url "
                                                   "and no --twin it only records, so the slot actions' answers "
                                                   "the log lacks are known")
    ap.add_argument("--twin-flags", help="with --twin: slotlab's flags (default: the server's, from its log)")
    ap.add_argument("--record", help="record the proxy's traffic as a trace file (with --url: starts the proxy)")
    ap.add_argument("--json", action="store_true", help="print the golden-trace JSON schema")
    ap.add_argument("--events", help="also write every event as JSON lines to this file")
    ap.add_argument("--why", action="store_true", help="explain each miss the log shows (a request that reused less "
                                                       "than a slot or RAM entry held) with its cause (a log has no "
                                                       "prompts to test flag changes on: `slotlab simulate REC --why` "
                                                       "tests them on a recording)")
    args = ap.parse_args(argv)
    live = args.follow or args.url or command or args.twin
    if not live:
        if not args.log:
            ap.error("--log FILE is needed (or --follow / --url / -- llama-server ARGS... to watch live)")
        from slotlab.watch.report import run

        return run(args.log, as_json=args.json, events_path=args.events, why=args.why)
    from slotlab.watch.cli import run_live

    return run_live(args, command)


def cmd_proxy(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="slotlab proxy", description="A pass-through HTTP proxy for llama-server's "
                                 "and OpenAI's endpoints (streaming, client disconnects and the API key pass "
                                 "through) that records every request as a slotlab trace for replay / simulate.")
    ap.add_argument("--upstream", required=True, help="the server: http://HOST:PORT (or https://...)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8081, help="port to listen on (default 8081)")
    ap.add_argument("--record", help="write the trace here (kept current while the proxy runs); a .jsonl path "
                    "gets the chat calls as a session log (messages, tools, the reply as generated, arrival times)")
    ap.add_argument("--flags", default="", help="the upstream server's flags, written into the trace "
                                                "(e.g. \"-np 4 -c 8192\"); the proxy cannot see them")
    ap.add_argument("--sim-fields", action="store_true", help="also write each request's generated token ids "
                    "(`output`) for slotlab simulate (arrival times are always written)")
    args = ap.parse_args(argv)
    import shlex
    import signal

    from slotlab.proxy import ProxyServer

    px = ProxyServer(args.upstream, host=args.host, port=args.port, record=args.record, flags=shlex.split(args.flags),
                     sim_fields=args.sim_fields)
    px.start()

    def terminated(*_):
        raise KeyboardInterrupt  # SIGTERM ends the proxy like Ctrl-C: the trace is written

    signal.signal(signal.SIGTERM, terminated)
    print(f"slotlab proxy: http://{args.host}:{args.port} -> {args.upstream}"
          + (f", recording to {args.record}" if args.record else ""), file=sys.stderr, flush=True)
    if args.record and not args.flags:
        print("slotlab proxy: note: no --flags: the trace will have none (give the server's flags so that replay "
              "runs the same configuration)", file=sys.stderr, flush=True)
    px.serve_forever()
    rec = px.recorder
    n = len(rec.records)
    print(f"slotlab proxy: {px.app.n_requests} requests forwarded, {n} recorded, {px.app.n_disconnects} client "
          f"disconnects, {px.app.n_upstream_errors} upstream errors", file=sys.stderr)
    for p in (px.app.tap_errors + rec.problems)[-5:]:
        print(f"slotlab proxy: recorder problem: {p}", file=sys.stderr)
    return 0


def cmd_simulate(argv: list[str]) -> int:
    if any(a.split("=", 1)[0] in ("--fleet", "--router", "--scheduler") for a in argv):  # N servers behind a router
        from slotlab.fleet.cli import fleet_main

        return fleet_main(argv)
    from slotlab.sim.cli import simulate_main

    return simulate_main(argv)


def cmd_calibrate(argv: list[str]) -> int:
    from slotlab.sim.cli import calibrate_main

    return calibrate_main(argv)


def cmd_profiles(argv: list[str]) -> int:
    from slotlab.sim.cli import profiles_main

    return profiles_main(argv)


def cmd_report(argv: list[str]) -> int:
    from slotlab.report import report_main

    return report_main(argv)


def cmd_whatif(argv: list[str]) -> int:
    """`slotlab whatif`: slotlab.sim.whatif simulates the grid, slotlab.figures.whatif draws it."""
    from dataclasses import asdict

    from slotlab.sim.whatif import OBJECTIVES, best, parse_vary, run_grid, table_lines
    from slotlab.sim.cli import add_speed_args

    ap = argparse.ArgumentParser(prog="slotlab whatif", description="Simulate a trace under a grid of llama-server "
                                 "flag settings (paper memory, no model) and compare reuse, prefill, RAM and TTFT.",
                                 epilog="Other arguments are llama-server flags shared by every run (default: the "
                                 "trace's flags).")
    ap.add_argument("trace", help="a Mooncake .jsonl, an OpenAI-messages session log .jsonl, or a slotlab trace .json "
                                  "(with arrival / output per request)")
    ap.add_argument("--vary", action="append", metavar='"FLAG V1,V2,..."',
                    help='a flag and its values, e.g. --vary "--cache-ram 0,4096,16384" (repeatable: the grid is '
                         "every combination)")
    ap.add_argument("--proposals", action="store_true",
                    help="instead of a grid: llama-server as built (the flags given), each proposed change to its "
                         "rules (slotlab/proposals: open PRs, a newer build's rule) and the ideal caches of the same "
                         "memory, priced on the trace")
    ap.add_argument("--budget-mib", type=float, help="RAM budget for the prompt cache: name the best setting whose "
                                                     "peak RAM cache stays within it")
    ap.add_argument("--objective", choices=sorted(OBJECTIVES), default="ttft_p50",
                    help="what 'best' minimizes (default ttft_p50)")
    ap.add_argument("--ttft-target", type=float, metavar="SECONDS",
                    help='with --vary "--fleet N1,N2,..": name the smallest fleet whose TTFT p99 meets this, with '
                         "the best reuse at that size (the router)")
    ap.add_argument("--html", help="write a plotly figure of the grid here")
    ap.add_argument("--png", help="write the grid as a static picture (PNG) here")
    ap.add_argument("--json", action="store_true", help="print the runs as JSON")
    ap.add_argument("--profile", default=None, help="model profile: JSON or TOML file, shipped name (llama-3.1-8b) "
                                                    "or GGUF (default: the header of -m, or the embedded model)")
    add_speed_args(ap)
    ap.add_argument("--limit", type=int, help="only the first N requests")
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply the trace's arrival times")
    ap.add_argument("--jobs", type=int, help="parallel runs (default: min(cores, runs))")
    ap.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run the grid on this existing Dask cluster "
                    "instead of local processes (needs the optional extra: pip install 'slotlab[dask]'; the workers "
                    "need slotlab too)")
    args, base = ap.parse_known_args(argv)

    if args.proposals and args.vary:
        ap.error("--proposals prices the changes to llama-server on the flags given: give it no --vary")
    if not args.proposals and not args.vary:
        ap.error("give --vary \"FLAG V1,V2\" (a grid of settings) or --proposals")
    if args.proposals:
        return _whatif_proposals(args, base)
    try:
        varies = [parse_vary(v) for v in args.vary]
    except ValueError as ex:
        ap.error(str(ex))
    from slotlab.sim.traces import trace_kind

    if not base and trace_kind(args.trace) == "slotlab":
        base = list(json.loads(Path(args.trace).read_text()).get("flags", []))
    speed = whatif_speed(args, base)
    n = 1
    for _, vals in varies:
        n *= len(vals)
    tty = sys.stderr.isatty()

    def progress(i, total):
        if tty or i == total:
            print(f"\rwhatif: {i}/{total} runs", end="\n" if i == total else "", file=sys.stderr, flush=True)

    runs = run_grid(args.trace, base, varies, speed=speed, profile=args.profile, limit=args.limit,
                    time_scale=args.time_scale, jobs=args.jobs, progress=progress, scheduler=args.scheduler)
    pick = best(runs, args.budget_mib, args.objective)
    fleet_pick = None
    if args.ttft_target is not None:
        from slotlab.sim.whatif import smallest_fleet

        fleet_pick = smallest_fleet(runs, args.ttft_target)
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "best": pick.label if pick else None,
                          **({"smallest_fleet": fleet_pick.label if fleet_pick else None}
                             if args.ttft_target is not None else {})}, indent=1))
    else:
        print("\n".join(table_lines(runs)))
        what = OBJECTIVES[args.objective]
        if pick is None:
            print(f"best: no setting fits{'' if args.budget_mib is None else f' within {args.budget_mib:g} MiB'}")
        else:
            within = "" if args.budget_mib is None else f" within {args.budget_mib:g} MiB of RAM cache"
            print(f"best{within} (lowest {what}): {pick.label} — {what} {pick.value(args.objective):,.2f}, "
                  f"peak RAM {pick.peak_cache_bytes / 2**20:.0f} MiB, reused {100 * pick.reuse:.1f} %")
        if args.ttft_target is not None:
            if fleet_pick is None:
                print(f"smallest fleet: none of the fleet runs meets TTFT p99 <= {args.ttft_target:g} s"
                      + ("" if any("fleet" in r.extra for r in runs) else ' (vary "--fleet N1,N2,..")'))
            else:
                f = fleet_pick.extra["fleet"]
                who = (f"{f['servers']} servers behind the {f['router']} router" if f["servers"] > 1
                       else "1 server (no router needed)")
                print(f"smallest fleet with TTFT p99 <= {args.ttft_target:g} s: {who} — TTFT p99 "
                      f"{fleet_pick.ttft_p99:,.2f} s, reused {100 * fleet_pick.reuse:.1f} %")
    if args.html or args.png:
        from slotlab.figures.whatif import write_html, write_png
    if args.html:
        write_html(runs, args.html, pick=pick, budget_mib=args.budget_mib, title=f"slotlab whatif {Path(args.trace).name}")
        print(f"wrote {args.html}", file=sys.stderr)
    if args.png:
        write_png(runs, args.png, pick=pick, budget_mib=args.budget_mib, title=f"slotlab whatif {Path(args.trace).name}",
                  ttft_target=args.ttft_target, fleet_pick=fleet_pick)
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def whatif_speed(args, base: list[str]):
    """The grid's speed model, as `slotlab simulate` names it (--speed, --prefill-tps / --gen-tps, or the
    profile on --gpu), said once on stderr."""
    from slotlab.sim.cli import resolve_profile, speed_from_args

    return speed_from_args(args, resolve_profile(args.profile), base, "slotlab whatif")


def _whatif_proposals(args, base: list[str]) -> int:
    """`whatif --proposals`: slotlab.proposals.price runs it, slotlab.figures.proposals draws it."""
    from slotlab.proposals import price as PR
    from slotlab.sim.traces import trace_kind

    if not base and trace_kind(args.trace) == "slotlab":
        base = list(json.loads(Path(args.trace).read_text()).get("flags", []))
    speed = whatif_speed(args, base)
    tty = sys.stderr.isatty()

    def progress(i, total):
        if tty or i == total:
            print(f"\rwhatif --proposals: {i}/{total} runs", end="\n" if i == total else "", file=sys.stderr,
                  flush=True)

    rows = PR.price(args.trace, base, speed=speed, profile=args.profile, limit=args.limit,
                    time_scale=args.time_scale, jobs=args.jobs, progress=progress, scheduler=args.scheduler)
    if args.json:
        print(json.dumps(PR.as_json(rows), indent=1))
    else:
        print("\n".join(PR.table_lines(rows)))
    if args.html or args.png:
        from slotlab.figures import proposals, write_outputs

        write_outputs(proposals, rows, png=args.png, html=args.html,
                      title=f"slotlab whatif --proposals {Path(args.trace).name}")
    return 0


COMMANDS = {"info": cmd_info, "lab": cmd_lab, "replay": cmd_replay, "serve": cmd_serve, "watch": cmd_watch,
            "simulate": cmd_simulate, "calibrate": cmd_calibrate, "proxy": cmd_proxy, "whatif": cmd_whatif,
            "profiles": cmd_profiles, "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: slotlab {info,lab,replay,serve,watch,proxy,simulate,calibrate,whatif,report,profiles} ...\n  info    print model, context, slot configuration and build capabilities\n"
              "  lab     start JupyterLab on the notebooks (settings and workspace in lab/)\n"
              "  replay  replay a request trace as llama-server would serve it (--json for the golden schema)\n"
              "  serve   a llama-server compatible HTTP server on the lab's engine (same flags)\n"
              "  watch   read a real llama-server's log (--log FILE; live: --follow, --url, -- llama-server ARGS...)\n"
              "  proxy   a recording pass-through proxy in front of llama-server (--upstream URL --record trace.json)\n"
              "  simulate  a trace on the paper memory on a simulated clock (Mooncake .jsonl or slotlab .json)\n"
              "  calibrate time the model on this machine: the speed model for simulate (-o speed.json)\n"
              "  report  a recorded agent run per conversation: reused / re-processed tokens by cause (--png FILE)\n"
              "  whatif  simulate a trace under a grid of flag settings (--vary \"--cache-ram 0,4096\") and name the best\n"
              "  profiles  the shipped model profiles: memory kind, KV bytes a token, SWA window, checkpoint sizes")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except SlotlabError as e:
        print(f"slotlab: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
