"""`slotlab watch` live: follow a log (`--follow`), poll a server (`--url`), or start one
(`-- llama-server ARGS...`), print each request and each notable decision as it happens, and with
`--twin` run slotlab's engine beside it behind a recording proxy. At the end (Ctrl-C, `--duration`,
or the server's exit), the per-request report of `slotlab watch --log` (`--json`: replay's schema)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from slotlab.engine import event_types as T
from slotlab.errors import SlotlabError
from slotlab.watch import builds as B
from slotlab.watch.log_reader import flags_of

#: server flags the twin does not take from a watched command line (network, threads, logging)
_NOT_TWIN = {"--host": 1, "--port": 1, "-t": 1, "--threads": 1, "-tb": 1, "--threads-batch": 1, "--log-file": 1,
             "-lv": 1, "--verbosity": 1, "--log-verbosity": 1, "--api-key": 1, "--no-webui": 0, "-v": 0,
             "--verbose": 0, "--metrics": 0, "--log-colors": 1, "--log-prefix": 0, "--log-timestamps": 0}


def command_flags(command: list[str]) -> list[str]:
    """The llama-server flags of a command line (`llama-server ARGS`, `slotlab serve ARGS`,
    `python -m MODULE ARGS`), without its network / thread / log options."""
    i = 1
    if len(command) > 2 and Path(command[0]).name.startswith("python") and command[1] == "-m":
        i = 3
    elif len(command) > 1 and command[1] == "serve":
        i = 2
    out = []
    while i < len(command):
        a = command[i]
        key = a.split("=", 1)[0]
        if key in _NOT_TWIN:
            i += 1 + (_NOT_TWIN[key] if "=" not in a else 0)
            continue
        out.append(a)
        i += 1
    return out


def command_url(command: list[str]) -> tuple[str, str | None]:
    """The URL a server command line listens on (`--host`, `--port`; llama-server's defaults
    127.0.0.1:8080) and its `--api-key`, so that a watched child is polled without `--url`."""
    host, port, key = "127.0.0.1", "8080", None
    for i, a in enumerate(command):
        k, eq, v = a.partition("=")
        if not eq:
            v = command[i + 1] if i + 1 < len(command) else ""
        if k == "--host":
            host = v
        elif k == "--port":
            port = v
        elif k == "--api-key":
            key = v
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}", key


def _printer(out):
    def show(ev) -> None:
        k, d = ev.kind, ev.payload
        line = None
        if k == T.TASK_DONE:
            line = f"task {ev.task:>5} slot {ev.slot}: cache_n {d.cache_n}, prompt_n {d.prompt_n}, " \
                   f"{d.predicted_n} generated, slot holds {d.tokens_cached}"
        elif k == T.TASK_ERROR:
            line = f"task {ev.task:>5} error {d.code}: {ev.message}"
        elif k == T.CACHE_EVICT:
            line = f"RAM cache: entry #{d.entry_id} evicted ({d.reason}, {d.n_tokens} tokens)"
        elif k == T.CACHE_LOADED:
            line = f"task {ev.task:>5} slot {ev.slot}: loaded from the RAM cache"
        elif k == T.CHECKPOINT_RESTORED:
            line = f"task {ev.task:>5} slot {ev.slot}: {ev.message}"
        elif k in (T.SLOT_PURGE, T.DECODE_RETRY, T.DECODE_FAILED):
            line = ev.message
        elif k == T.LOG and ev.message.startswith(("slotlab watch:", "slotlab twin:")):
            line = ev.message
        if line is not None:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", file=out, flush=True)
    return show


def run_live(args, command: list[str] | None, out=None) -> int:
    from slotlab.watch.live import Watch

    out = out or sys.stdout
    if args.twin and not args.url:
        raise SlotlabError("--twin needs --url: the server the proxy forwards to (clients then talk to the proxy)")
    show = _printer(sys.stderr if args.json else out)
    serverish = command and ("llama-server" in Path(command[0]).name
                             or any(a.split("=")[0] in ("--port", "--host") for a in command))
    if serverish and not args.url:
        args.url, key = command_url(command)  # the child's own address: poll it too
        args.api_key = args.api_key or key
    watch = Watch(args.log, command=command, url=args.url, api_key=args.api_key, poll=args.poll,
                  from_start=not args.from_end, restarts=args.restarts, on_event=show)
    proxy = twin = None
    watch.start()
    try:
        if args.twin:
            from slotlab.proxy import ProxyServer
            from slotlab.watch.twin import Twin

            if args.twin_flags is not None:
                flags = shlex.split(args.twin_flags)
            elif command:
                flags = command_flags(command)
            else:
                watch.wait_for(lambda: bool(flags_of(watch.events.replay().events)), 30)
                flags = flags_of(watch.events.replay().events)
                print(f"slotlab watch: twin flags from the server's log: {' '.join(flags)} (give --twin-flags for "
                      "the exact ones)", file=sys.stderr)
            if args.twin_flags is None and "--server-build" not in flags:
                # the server's own rules where they are not the pin's: its build from the log (or /props)
                from slotlab.engine.flags import SERVER_BUILDS, rules_of_build

                watch.wait_for(lambda: watch.reader.build.build is not None, 10)
                rb, why = rules_of_build(watch.reader.build.build)
                if rb != SERVER_BUILDS[0]:
                    flags = [*flags, "--server-build", str(rb)]
                    print(f"slotlab watch: the twin follows b{rb}'s rules (--server-build {rb}): the server is "
                          f"{B.name(watch.reader.build.build)}" + (f"; {why}" if why else ""), file=sys.stderr)
            twin = Twin(flags)
            proxy = ProxyServer(args.url, port=args.proxy_port, record=args.record, flags=flags).start()
            twin.attach(proxy)
            watch.attach_twin(twin)
            print(f"slotlab watch: twin running; send your requests to the proxy at {proxy.url}", file=sys.stderr,
                  flush=True)
        elif args.url and (args.proxy_port is not None or args.record):
            from slotlab.proxy import ProxyServer

            # no twin: the proxy only records, so the slot actions' answers (not in the log) are known
            proxy = ProxyServer(args.url, port=args.proxy_port, record=args.record).start()
            print(f"slotlab watch: recording proxy running; send your requests to {proxy.url}", file=sys.stderr,
                  flush=True)
        if proxy is not None:
            watch.attach_recorder(proxy.recorder)
        deadline = time.monotonic() + args.duration if args.duration else None
        while deadline is None or time.monotonic() < deadline:
            if watch.state.startswith(("exited", "could not")):
                break
            if twin is not None:
                twin.summary()  # puts a new first difference on the event list (printed above)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        if proxy is not None:
            proxy.stop()
        watch.stop()
    if twin is not None:
        twin.wait(60)
        print(twin.summary(), file=sys.stderr)
        twin.close()
    results = watch.results()
    if args.events:
        from slotlab.watch.report import write_events

        write_events(watch.events.replay().events, args.events)
    if args.json:
        print(json.dumps({"flags": flags_of(watch.events.replay().events), "results": results,
                          "build": watch.reader.build.summary()}, indent=1, ensure_ascii=False), file=out)
    else:
        for s in watch.status_lines():
            print(s, file=out)
        print(f"{len(results)} requests seen", file=out)
    return 0
