"""`slotlab report TRACE`: a recorded agent run, conversation by conversation — each call's reused and
re-processed tokens, what broke the prefix (the client's change, the server's mechanism), as text, JSON
and a static picture (`--png`, slotlab.figures.timeline).

TRACE is a session log (one JSON line per call: `session_id`, `messages`, `tools`, the `reply` as
generated) or a trace written by `slotlab proxy --record` (requests with `messages`). Its calls are
replayed one at a time in the order they were made (as `slotlab replay` runs a trace and the session
recorder sent them), on the paper memory by default: the server's decisions with nothing decoded, each
call generating the reply it got when recorded, so the prompts that repeat it match as they did. The
events of that replay, with a `client_call` event per call (slotlab.conversation's change against the
conversation's previous call), are folded by slotlab.timeline.Timeline: the numbers printed and drawn
are the replay's own `cache_n` / `prompt_n`."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slotlab.errors import TraceError

NO_CALLS = ("has no chat calls: the conversation timeline needs each call's messages — a session log (one JSON "
            "line per call with session_id and messages) or a trace written by `slotlab proxy --record` (its "
            "requests keep their messages)")


@dataclass
class Loaded:
    """A trace as the report replays it: engine requests (token prompts), the chat calls behind them,
    each request's recorded generation, the tokenizer."""

    flags: list
    requests: list  # engine trace requests ({"prompt": ids or text, "n_predict", ...})
    calls: list  # slotlab.conversation.Call, call.request = index into requests
    outputs: list  # per request: recorded generated token ids, or None
    vocab: object
    path: str


def load(path, *, flags: list[str] | None = None, model=None) -> Loaded:
    """A session log or a proxy's trace (module docstring); a TraceError for anything else."""
    from slotlab.sim.traces import load_sessions, trace_kind

    p = Path(path)
    if not p.exists():
        raise TraceError(f"cannot read trace {p}: no such file")
    kind = trace_kind(p)
    if kind == "mooncake":
        raise TraceError(f"{p} is a Mooncake trace (token hashes, no messages): it {NO_CALLS}")
    if kind == "sessions" and flags is not None:
        from slotlab.sim.cli import flags_of_log

        flags = flags_of_log(p, list(flags), "slotlab report")
    if model is None and flags:
        from slotlab.sim.cli import model_flag

        model = model_flag(flags)
    if kind == "sessions":
        st = load_sessions(p, model=model)
        reqs = sorted(st.requests, key=lambda q: q.call.request)  # the order the calls were made in
        requests, calls, outputs = [], [], []
        for i, q in enumerate(reqs):
            r = {"prompt": np.asarray(q.prompt, dtype=np.int32).tolist(), "n_predict": int(q.n_predict)}
            r.update({k: v for k, v in q.fields.items() if k in ("id_slot", "cache_prompt", "n_cache_reuse",
                                                                   "message_delimiters")})
            requests.append(r)
            q.call.request = i
            calls.append(q.call)
            outputs.append(q.output)
        return Loaded(list(flags or []), requests, calls, outputs, st.vocab, str(p))
    from slotlab.conversation import _text, calls_of_trace
    from slotlab.engine.replay import load_trace

    tr = load_trace(p)
    calls = calls_of_trace(tr.requests, str(p))
    if not calls:
        raise TraceError(f"{p} {NO_CALLS}")
    from slotlab.engine.params import ServerParams
    from slotlab.engine.replay import resolve_flags
    from slotlab.llama import Model

    fl = list(flags) if flags else list(tr.flags)
    vocab = model if model is not None and not isinstance(model, str) else Model(
        model or ServerParams.from_args(resolve_flags(fl)).model)
    outputs = []
    by_req = {c.request: c for c in calls}
    for i, r in enumerate(tr.requests):
        o = r.get("output")
        if o is None and i in by_req and by_req[i].reply is not None:  # the reply as generated, as text
            text = _text(by_req[i].reply)
            o = vocab.tokenize(text, add_special=False, parse_special=False) if text else None
        outputs.append(None if o is None else np.asarray(o, dtype=np.int32))
    return Loaded(fl, list(tr.requests), calls, outputs, vocab, str(p))


def run(ld: Loaded, *, memory: str = "paper"):
    """Replay `ld` with a `client_call` event per call; returns (Timeline, replay result dict)."""
    from slotlab.conversation import Renderer, client_changes
    from slotlab.engine.params import ServerParams
    from slotlab.engine.replay import Trace, replay, resolve_flags
    from slotlab.timeline import Timeline, emit_call, sessions_of

    flags = resolve_flags(ld.flags, ld.vocab)
    tmp = tempfile.TemporaryDirectory(prefix="slotlab-report-")
    if "--slot-save-path" not in flags:
        flags = [*flags, "--slot-save-path", tmp.name]
    params = ServerParams.from_args(flags)
    renderer = Renderer.of(ld.vocab, params)
    changes = {c.request: c for c in client_changes(ld.calls, renderer)} if len(ld.calls) > 1 else {}
    sess = dict(zip((c.request for c in ld.calls), sessions_of(ld.calls, renderer)))
    if memory == "paper":
        from slotlab.sim.paper_replay import paper_engine

        eng, _ = paper_engine(params, vocab=ld.vocab)
        scripts = eng.memory.scripts
    elif memory == "real":
        from slotlab.engine.scheduler import Engine

        eng, scripts = Engine(params, model=ld.vocab), None
    else:
        raise ValueError(f"memory must be 'paper' or 'real', not {memory!r}")

    def on_submit(i: int, task) -> None:
        if task is None:
            return
        o = ld.outputs[i] if i < len(ld.outputs) else None
        if scripts is not None and o is not None and len(o):
            scripts[task.id] = np.asarray(o, dtype=np.int32)  # the reply it got when recorded
        if i in sess:
            emit_call(eng.events, task.id, i, sess[i], changes.get(i))

    try:
        out = replay(Trace(flags, ld.requests, ld.path), engine=eng, on_submit=on_submit)
        tl = Timeline().fold(eng.events.replayable())
    finally:
        eng.close()
        tmp.cleanup()
    return tl, out


def lines(tl) -> list[str]:
    """The report as text: per conversation, per call, reused + processed and what broke the prefix."""
    rows = []
    for s, bars in tl.conversations().items():
        n_re = sum(b.reprocessed for b in bars)
        rows.append(f"conversation {s}: {len(bars)} calls, {sum(b.cache_n for b in bars)} tokens reused, "
                    f"{sum(b.prompt_n for b in bars)} processed ({n_re} of them held before and processed again)")
        for b in bars:
            what = b.label()
            rows.append(f"  #{b.request:<3} reused {b.cache_n:>6}  processed {b.prompt_n:>6}"
                        + (f"  {what}" if what else ""))
            c = b.call
            if c is not None and c.change:
                rows.append(f"       client: {c.change} at message {c.message_index} ({c.role}): {c.before!r} -> "
                            f"{c.after!r}" + (f" — {c.advice}" if c.advice else ""))
            if b.miss is not None:
                rows.append(f"       server: {b.miss.detail}")
    tot = tl.totals()
    by = ", ".join(f"{k.split(':', 1)[-1]} {v}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1])
                   if k not in ("reused", "new"))
    rows.append(f"tokens processed again by cause: {by or 'none'}; reused {tot.get('reused', 0)}, new "
                f"{tot.get('new', 0)}")
    return rows


def as_json(tl) -> dict:
    return {"conversations": [
        {"session": s, "calls": [{"request": b.request, "cache_n": b.cache_n, "prompt_n": b.prompt_n,
                                  "parts": [{"cause": c, "tokens": n} for c, n in b.parts],
                                  "change": None if b.call is None or not b.call.change else b.call.change,
                                  "message": None if b.call is None or not b.call.change else b.call.message_index,
                                  "miss": None if b.miss is None else b.miss.cause} for b in bars]}
        for s, bars in tl.conversations().items()], "totals": tl.totals()}


def report_main(argv: list[str]) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="slotlab report", description="A recorded agent run, conversation by "
                                 "conversation: each call's reused and re-processed tokens and what broke the "
                                 "prefix (the client's change, the server's mechanism).",
                                 epilog="Other arguments are llama-server flags (default: the trace's flags; a "
                                        "session log has none: give the server's, e.g. -np 1 -c 8192).")
    ap.add_argument("trace", help="a session log .jsonl (session_id, messages, tools, reply per line) or a trace "
                                  "written by `slotlab proxy --record`")
    ap.add_argument("--png", help="write the conversation timeline as a static picture (PNG) here")
    ap.add_argument("--json", action="store_true", help="print the bars as JSON")
    ap.add_argument("--memory", choices=("paper", "real"), default="paper",
                    help="paper (default): the server's decisions, nothing decoded, each call generating its "
                         "recorded reply; real: the model runs (its own replies)")
    args, flags = ap.parse_known_args(argv)
    ld = load(args.trace, flags=flags)
    tl, _ = run(ld, memory=args.memory)
    if args.json:
        print(json.dumps(as_json(tl), indent=1, ensure_ascii=False))
    else:
        print("\n".join(lines(tl)))
    if args.png:
        from slotlab.figures.timeline import write_png

        write_png(tl, args.png, title=f"slotlab report {Path(args.trace).name}"
                  + (f" ({' '.join(ld.flags)})" if ld.flags else ""))
        print(f"wrote {args.png}", file=sys.stderr)
    return 0
