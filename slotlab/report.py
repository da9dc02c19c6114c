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
            r = {"prompt": np.asarray(q.prompt, dtype=np.int32).tolist(), "n_predict": int(q.n_predict),
                 "endpoint": "/v1/chat/completions"}  # a chat call: its delimiters are the template's
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


class ReportRunner:
    """The report's runs for slotlab.why.session.analyse_runs: the calls replayed one at a time in the
    order made (`run`), on paper, with a call's prompt replaced (a stable client's) or flags added; the
    recorded replies scripted as in the report itself."""

    def __init__(self, ld: Loaded):
        from slotlab.engine.params import ServerParams
        from slotlab.engine.replay import resolve_flags

        self.ld = ld
        self.params = ServerParams.from_args(resolve_flags(ld.flags, ld.vocab))
        self.seconds = 0.0
        self.n_runs = 0

    def calls(self) -> list:
        return list(self.ld.calls)

    def prompts(self) -> list:
        return [None] * len(self.ld.calls)  # as recorded

    def n_predict(self) -> list[int]:
        return [int(self.ld.requests[c.request].get("n_predict", 0)) for c in self.ld.calls]

    def renderer(self, params=None):
        from slotlab.conversation import Renderer

        return Renderer.of(self.ld.vocab, params or self.params)

    def run(self, prompts=None, extra=(), explain: bool = False):
        import dataclasses
        import time

        from slotlab.why.advice import Run

        t0 = time.perf_counter()
        reqs = list(self.ld.requests)
        for c, toks in zip(self.ld.calls, prompts or []):
            if toks is not None:
                reqs[c.request] = {**reqs[c.request], "prompt": np.asarray(toks, dtype=np.int32).tolist()}
        tl, out = run(dataclasses.replace(self.ld, flags=[*self.ld.flags, *extra], requests=reqs), memory="paper")
        bars = {b.request: b for b in tl.bars()}
        res = out["results"]
        per, misses, failed, lost = [], [], set(), {}
        for i, c in enumerate(self.ld.calls):
            b = bars.get(c.request)
            r = res[c.request] if c.request < len(res) else {}
            if b is None or r.get("error") is not None:
                failed.add(i)
            per.append((b.cache_n, b.prompt_n) if b is not None else (0, 0))
            m = b.miss if b is not None else None
            misses.append(m)
            if m is not None:
                lost[m.cause] = lost.get(m.cause, 0) + m.lost
        self.seconds += time.perf_counter() - t0
        self.n_runs += 1
        core = getattr(out.get("engine"), "core", None)
        return Run(per, misses, failed, sum(p for _, p in per), out, None, getattr(core, "n_ctx_slot", None), lost)


def analysis(ld: Loaded, progress=None):
    """What a stable client would have reused and the advice that worked (slotlab.why.session), for
    the report's calls replayed as the report replays them."""
    from slotlab.why.session import analyse_runs

    rr = ReportRunner(ld)
    return analyse_runs(rr, params=rr.params, progress=progress)


def lines(tl, sw=None) -> list[str]:
    """The report as text: per conversation, per call, reused + processed and what broke the prefix;
    with `sw` (`analysis`), what a stable client would have reused and the advice that worked."""
    rows = []
    cost = {c.request: c for c in sw.pricing.calls} if sw is not None and sw.pricing is not None else {}
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
            cc = cost.get(b.request)
            if cc is not None and (cc.stable_processed != b.prompt_n or cc.change):
                rows.append(f"       a stable client: reused {cc.stable_reused}, processed {cc.stable_processed}"
                            + (f" (the change cost {cc.client})" if cc.change and not cc.why else
                               f" (not priced: {cc.why})" if cc.why else ""))
    tot = tl.totals()
    by = ", ".join(f"{k.split(':', 1)[-1]} {v}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1])
                   if k not in ("reused", "new"))
    rows.append(f"tokens processed again by cause: {by or 'none'}; reused {tot.get('reused', 0)}, new "
                f"{tot.get('new', 0)}")
    if sw is not None:
        if sw.pricing is not None:
            rows += sw.pricing.lines()
        rows += sw.advice.lines()
    return rows


def as_json(tl, sw=None) -> dict:
    extra = {} if sw is None else {"stable": None if sw.pricing is None else sw.pricing.as_json(),
                                   "advice": sw.advice.as_json()}
    return {**extra, "conversations": [
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
    ap.add_argument("trace", help="a session log .jsonl (session_id, messages, tools, reply per line), a trace "
                                  "written by `slotlab proxy --record`, or a fleet run (`slotlab simulate TRACE "
                                  "--fleet N --json > run.json`: server by server, --png its lanes)")
    ap.add_argument("--png", help="write the conversation timeline as a static picture (PNG) here")
    ap.add_argument("--json", action="store_true", help="print the bars as JSON")
    ap.add_argument("--memory", choices=("paper", "real"), default="paper",
                    help="paper (default): the server's decisions, nothing decoded, each call generating its "
                         "recorded reply; real: the model runs (its own replies)")
    ap.add_argument("--no-advice", action="store_true", help="leave out what a stable client would have reused "
                    "and the advice (each a run of the whole session on paper)")
    args, flags = ap.parse_known_args(argv)
    from slotlab.fleet.report import is_fleet_json

    if is_fleet_json(args.trace):  # a fleet run (`slotlab simulate --fleet N --json`): server by server
        return _fleet_report(args)
    ld = load(args.trace, flags=flags)
    tl, _ = run(ld, memory=args.memory)
    sw = None
    if not args.no_advice and len(ld.calls) > 0:
        from slotlab.why.advice import progress_line

        say = progress_line("slotlab report")
        sw = analysis(ld, progress=say)
        if say:
            print(file=sys.stderr)
    if args.json:
        print(json.dumps(as_json(tl, sw), indent=1, ensure_ascii=False))
    else:
        print("\n".join(lines(tl, sw)))
    if args.png:
        from slotlab.figures.timeline import write_png

        write_png(tl, args.png, title=f"slotlab report {Path(args.trace).name}"
                  + (f" ({' '.join(ld.flags)})" if ld.flags else ""))
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _fleet_report(args) -> int:
    """`slotlab report run.json` on a fleet run: slotlab.fleet.report's lines, --json the run itself, --png
    the lanes (slotlab.figures.fleet)."""
    from slotlab.fleet import report as FR

    d = FR.load_fleet(args.trace)
    if args.json:
        print(json.dumps({"servers": [{"server": s["server"], **s["totals"]} for s in d["servers"]],
                          "fleet": d["fleet"], "totals": d["totals"]}, indent=1))
    else:
        print("\n".join(FR.lines(d)))
    if args.png:
        from slotlab.figures import fleet, write_outputs

        f = d["fleet"]
        write_outputs(fleet, d, png=args.png,
                      title=f"slotlab report {Path(args.trace).name}: {f['servers']} servers behind the {f['router']} router")
    return 0
