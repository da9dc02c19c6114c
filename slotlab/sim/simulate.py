"""`slotlab simulate`: a trace on the paper memory, on a simulated clock.

The decisions are the engine's own: the real `ServerCore` runs step by step (one `update_slots` a
step) on a `SimMemory`, exactly as `slotlab replay --memory paper` runs it. What is simulated is
time: each step costs what the speed model says its decodes cost (`SpeedModel.decode_time` of each
decode's token and output counts, and of the context its rows' sequences hold when the model has an
attention term) and the sequence state it copied (checkpoints, RAM-cache saves and loads); a request is submitted when the clock reaches its arrival; when the server
is idle the clock jumps to the next arrival (a discrete-event clock: nothing happens in between, so
nothing is computed). Concurrency, deferral, idle-slot saves and the queue follow from the arrivals.

Fast mode (`fast=True`, the default) gives the same per-request results and decisions with far fewer
engine steps: generation-only stretches and the later chunks of prompts are fast-forwarded
(fastforward.py), and requests that arrive while every slot is busy are held by the simulator until
the server would launch them (`_post_order`) instead of being posted and deferred. Only `decode` / `slot_snapshot` events (summarized) and the
deferral passes' events differ from `fast=False`.

Generated tokens come from the trace where it has them (`output`), otherwise they are the paper
memory's placeholders (ids that match no prompt token).

Per request the results also hold `prompt_s`, the server's `prompt_ms` in seconds: from the slot's
prompt start (after the launch's own state copies, a RAM-cache load and the idle-slot saves, which
the server does before `t_start_process_prompt`) to the first token; TTFT counts those copies too.

The report: per request slot, cache_n, prompt_n, queue wait, TTFT, end; totals: prompt tokens
reused vs prefilled, the infinite-cache bound (Mooncake hash_ids), RAM-cache evictions by reason,
peak cache bytes, queue wait and TTFT p50 / p99."""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from slotlab.engine import event_types as T
from slotlab.proposals import active as active_proposals
from slotlab.memory.paper import PaperVocab
from slotlab.sim.fastforward import FastForward, Prechains
from slotlab.sim.paper_replay import paper_engine
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import SimTrace

__all__ = ["SimResult", "simulate"]


@dataclass
class _Rec:
    i: int
    arrival: float
    task: object = None
    launched: float | None = None
    prompt_start: float | None = None  # the server's t_start_process_prompt: after the launch's state copies
    first: float | None = None
    end: float | None = None


@dataclass
class SimResult:
    flags: list[str]
    results: list[dict]
    totals: dict
    engine: object = None
    events_path: str | None = None
    wall_s: float = 0.0

    def as_json(self) -> dict:
        return {"flags": self.flags, "totals": self.totals, "results": self.results}

    def lines(self, per_request: bool = True, limit: int = 50) -> list[str]:
        out = []
        if per_request:
            out.append(f"{'#':>5} {'arrive':>9} {'slot':>4} {'status':>6} {'cached':>7} {'prefill':>7} {'gen':>5} "
                       f"{'wait':>8} {'ttft':>8} {'end':>9}")
            rows = self.results if limit is None or len(self.results) <= limit else self.results[:limit]
            for r in rows:
                f = lambda v, w, p=3: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
                if r["status"] != 200:
                    out.append(f"{r['i']:>5} {r['arrival']:>9.3f} {'-':>4} {r['status']:>6}  {r['error']}")
                    continue
                out.append(f"{r['i']:>5} {r['arrival']:>9.3f} {r['id_slot']:>4} {r['status']:>6} {r['cache_n']:>7} "
                           f"{r['prompt_n']:>7} {r['predicted_n']:>5} {f(r['queue_wait'], 8)} {f(r['ttft'], 8)} "
                           f"{f(r['end'], 9)}")
            if len(rows) < len(self.results):
                out.append(f"... {len(self.results) - len(rows)} more (--json for all)")
        t = self.totals
        pct = lambda a, b: f"{100 * a / b:.1f} %" if b else "-"  # noqa: E731
        out += [
            f"requests    {t['n_requests']} ({t['n_ok']} ok, {t['n_errors']} errors) over {t['sim_seconds']:.1f} s "
            f"simulated ({t['wall_seconds']:.1f} s wall)",
            f"prompt      {t['prompt_tokens']} tokens: {t['tokens_reused']} reused ({pct(t['tokens_reused'], t['prompt_tokens'])}),"
            f" {t['tokens_prefilled']} prefilled; generated {t['tokens_generated']}",
        ]
        if t.get("bounds") is not None:
            from slotlab.ideal import Bounds

            out += ["bound       " + ln if k == 0 else ln
                    for k, ln in enumerate(Bounds.lines_of(t["bounds"], t["prompt_tokens"]))]
        elif t.get("infinite_cache_tokens") is not None:
            out.append(f"bound       an infinite prefix cache could reuse {t['infinite_cache_tokens']} "
                       f"({pct(t['infinite_cache_tokens'], t['prompt_tokens'])})")
        ev = ", ".join(f"{k} {v}" for k, v in sorted(t["evictions"].items())) or "none"
        if t.get("proposals"):
            from slotlab.proposals import get

            out.append("rules       the build's own, changed by " + ", ".join(get(n).label() for n in t["proposals"])
                       + (f"; {t['disk_reads']} entries ({t['disk_read_bytes'] / 2**30:.1f} GiB) read back from disk"
                          if t.get("disk_reads") else ""))
        out += [
            f"ram cache   peak {t['peak_cache_bytes'] / 2**20:.1f} MiB; evictions: {ev}; slot clears: "
            + (", ".join(f"{k} {v}" for k, v in sorted(t["slot_clears"].items())) or "none"),
            f"latency     queue wait p50 {t['queue_wait_p50']:.3f} s, p99 {t['queue_wait_p99']:.3f} s; "
            f"TTFT p50 {t['ttft_p50']:.3f} s, p99 {t['ttft_p99']:.3f} s",
            f"speed       {t['speed']}",
        ]
        return out


def _pct(xs, q) -> float:
    return float(np.percentile(xs, q)) if len(xs) else 0.0


#: the gen-0 threshold of Python's cycle collector while a simulation runs (see `_fewer_gc_passes`)
GC_GEN0_THRESHOLD = 50_000
_gc_lock = threading.Lock()
_gc_state = {"depth": 0, "saved": None}


def _fewer_gc_passes(fn):
    """Run `fn` with the cycle collector's gen-0 threshold raised to `GC_GEN0_THRESHOLD` (unless it is
    already higher, or the collector is off), restored when the last running simulation returns.

    Why: a simulation makes millions of small container objects (an event, its payload and their
    lists per engine decision, ~45 per request) and keeps the last `max_log` events, so with the
    default threshold (700) the collector ran every few hundred events and kept rescanning the live
    log, and every ~100 passes the whole heap: ~10-13 % of the CPU time of a Mooncake simulation,
    for almost no garbage (the objects die by reference counting when the log is trimmed; the
    collector found a few hundred cycles in 4,000 requests). With 50,000 it runs a few dozen times.
    Nothing the simulation computes depends on when cycles are collected, so the results are the
    same; the setting is process-wide, hence counted (nested / concurrent simulations restore it
    once, when the last one ends)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _gc_lock:
            st = _gc_state
            if st["depth"] == 0:
                st["saved"] = gc.get_threshold()
                t0 = st["saved"][0]
                if 0 < t0 < GC_GEN0_THRESHOLD:
                    gc.set_threshold(GC_GEN0_THRESHOLD, *st["saved"][1:])
            st["depth"] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _gc_lock:
                st["depth"] -= 1
                if st["depth"] == 0:
                    gc.set_threshold(*st["saved"])

    return run


@_fewer_gc_passes
def simulate(trace: SimTrace, flags: list[str] | str | None = None, *, speed: SpeedModel, profile=None, vocab=None,
             progress: Callable[[int, int, float], None] | None = None, keep_events: bool = False,
             max_log: int = 20_000, fast: bool = True, listen: Callable | None = None,
             observers: Sequence[Callable] = (), hindsight: bool = True, bounds: bool = False) -> SimResult:
    """Run `trace` (its requests with arrivals) under llama-server `flags` (default: the trace's) on a
    paper memory for `profile` (default: the GGUF at -m / the default model), with step times from
    `speed`. `vocab` tokenizes text prompts. `fast`: fast-forward pure generation (fastforward.py;
    the same decisions and results, fewer `decode` / `slot_snapshot` events); `listen(event)` is
    subscribed to the engine's events before the first request; `observers` (e.g.
    `slotlab.explain.attach`) before its first event. `hindsight=False`: keep none of the facts only
    explanations read (engine/hindsight.py; the same decisions, faster). `bounds`: with block ids
    (Mooncake), what ideal prefix caches of the same memory would reuse (slotlab.ideal), in
    `totals["bounds"]`. Slot actions of a slotlab trace run at their arrivals in a slot directory of
    the run's own (unless the flags name one), with the trace's input files installed there."""
    wall0 = time.perf_counter()
    if vocab is None:  # a session log brings the tokenizer its message delimiters need
        vocab = getattr(trace, "vocab", None)
    if flags is None:
        flags = trace.flags
    if isinstance(flags, str):
        flags = flags.split()
    reqs = trace.requests
    run_flags = list(flags)
    slot_dir = None
    if any(q.action is not None for q in reqs) and "--slot-save-path" not in run_flags:
        # slot actions write and read files: a directory of the run's own, with the trace's input files
        import tempfile

        slot_dir = tempfile.TemporaryDirectory(prefix="slotlab-sim-slots-")
        run_flags += ["--slot-save-path", slot_dir.name]
    if trace.files and "--slot-save-path" in run_flags:
        from slotlab.engine.replay import install_files  # the trace's input files, as replay installs them

        install_files(trace, run_flags[run_flags.index("--slot-save-path") + 1])
    try:
        return _simulate(trace, flags, run_flags, speed=speed, profile=profile, vocab=vocab, progress=progress,
                         keep_events=keep_events, max_log=max_log, fast=fast, listen=listen, observers=observers,
                         hindsight=hindsight, wall0=wall0, bounds=bounds)
    finally:
        if slot_dir is not None:
            slot_dir.cleanup()


def _simulate(trace, flags, run_flags, *, speed, profile, vocab, progress, keep_events, max_log, fast, listen,
              observers, hindsight, wall0, bounds) -> SimResult:
    from slotlab.engine.params import ServerParams

    params = ServerParams.from_args(run_flags)
    eng, alloc = paper_engine(params, vocab=vocab, profile=profile, observers=observers, hindsight=hindsight)
    if not keep_events:  # a bounded log: the report folds what it needs as the events happen
        eng.events.max_log, eng.events.trim_chunk = max_log, max(1, max_log // 50)
        if eng.core.cache is not None:  # nor does it read the per-entry listing of the RAM cache
            eng.core.cache.per_entry = False
    mem, core = eng.memory, eng.core
    if speed.n_ubatch != mem.n_ubatch:
        speed = dataclasses.replace(speed, n_ubatch=mem.n_ubatch)
    reqs = trace.requests
    n = len(reqs)
    actions: list[_Rec] = []  # slot actions posted and not answered yet
    recs = [_Rec(i, r.arrival) for i, r in enumerate(reqs)]
    by_task: dict[int, _Rec] = {}
    evictions: Counter = Counter()
    clears: Counter = Counter()
    clock = [0.0]
    peak = [0]
    disk = [0, 0]  # entries, bytes read back from the cache-disk proposal's tier
    just_launched: list[_Rec] = []

    def on_event(ev) -> None:
        k = ev.kind
        if k == T.TASK_LAUNCHED:
            r = by_task.get(ev.task)
            if r is not None and r.launched is None:
                r.launched = clock[0]
                just_launched.append(r)
        elif k == T.CACHE_ALLOC:  # the cache's size just after an append (checkpoints included) is a peak
            sz = core.cache.size()
            if sz > peak[0]:
                peak[0] = sz
        elif k == T.CACHE_EVICT:
            evictions[ev.payload.reason] += 1
        elif k == T.CACHE_DISK_LOAD:  # the cache-disk proposal: what came back from the disk tier
            disk[0] += 1
            disk[1] += ev.payload.size
        elif k == T.SLOT_CLEAR:
            if ev.payload.n_tokens > 0:
                clears[ev.payload.reason] += 1

    eng.events.subscribe(on_event)
    if listen is not None:
        eng.events.subscribe(listen)
    if not keep_events and listen is None and not observers and not hindsight:
        # nobody reads the other events (no log kept, no listener, no explainer, no hindsight): only
        # the kinds on_event folds are built; the decisions do not read events
        eng.events.only = frozenset({T.TASK_LAUNCHED, T.CACHE_ALLOC, T.CACHE_EVICT, T.SLOT_CLEAR, T.CACHE_DISK_LOAD})
        core.response_text = False  # nor the responses' text: the report keeps counts (_summary)
    pending_first: dict[int, _Rec] = {}

    def on_token(task, tok) -> None:
        r = by_task.get(task.id)
        if r is not None and r.first is None:
            pending_first[task.id] = r

    i = 0
    n_done = 0
    step = core.step
    decoded, decoded_out, decoded_ctx, decoded_kv = mem.decoded, mem.decoded_out, mem.decoded_ctx, mem.decoded_kv
    ctx_cost = mem.count_ctx = speed.t_ctx > 0 or speed.t_kv > 0  # the attention terms need each decode's context
    dt_of = speed.decode_time
    ff = FastForward(core, dt_of, speed.step_clocks, first_token_only=on_token, copy_time=speed.copy_time) if fast else None
    if ff is not None:
        ff.ctx_cost = ctx_cost
        if isinstance(mem.gen_vocab, PaperVocab):  # the requests' placeholders, computed ahead in bulk
            ff.pre = Prechains(mem.gen_vocab, reqs, _tail)
            ff.index_of = lambda task: (r.i if (r := by_task.get(task.id)) is not None else None)
    # hold-back (fast mode, requests without id_slot): a request that arrives while every slot is busy
    # is kept here instead of being posted and deferred; see _post_order
    hold = fast and not any("id_slot" in q.fields or q.action is not None for q in reqs)
    # requests without an arrival in a slotlab trace: posted in order, each once the earlier requests it
    # waits for are answered (the recorder's and replay's `wait`); the others by their arrival
    waited: set | None = set() if any(q.sequential for q in reqs) else None
    if waited is not None:
        hold = False
    held: collections.deque[int] = collections.deque()
    last_report = 0.0
    inf = float("inf")

    def post(j: int) -> None:
        q, r = reqs[j], recs[j]
        if q.action is not None:  # POST /slots/{id}?action=...: answered when the server loop runs it
            a = q.action
            t = core.slot_action_task(a["action"], a.get("id_slot", 0), a.get("filename"))
            r.task = t
            actions.append(r)
            if not t.done:
                core.post(t)
            return
        kw = dict(q.fields)
        kw.setdefault("n_predict", q.n_predict)
        t = core.completion_task(q.tokens(vocab), ignore_eos=True, on_token=on_token, **kw)
        r.task = t
        by_task[t.id] = r
        if q.output is not None and len(q.output):
            mem.scripts[t.id] = q.output
        core.post(t)

    while True:
        now = clock[0]
        i0 = i
        if waited is not None:  # in trace order, each after the earlier ones it waits for (replay's `wait`)
            while True:
                if actions:  # refused at once (a bad file name): answered before the next is sent
                    n_done += _answer_actions(actions, reqs, now)
                waited.difference_update([k for k in waited if recs[k].end is not None])
                if not (i < n and reqs[i].arrival <= now and not (reqs[i].sequential and waited)):
                    break
                recs[i].arrival = now
                post(i)
                if reqs[i].wait:
                    waited.add(i)
                i += 1
        else:
            while i < n and reqs[i].arrival <= now:
                i += 1
            if not hold:
                for j in range(i0, i):
                    post(j)
            elif held or i > i0:
                for j in _post_order(held, range(i0, i), sum(1 for s in core.slots if not s.is_processing)):
                    post(j)
        busy = core.tq.pending() or any(s.is_processing for s in core.slots)
        if not busy:
            if i >= n:
                break
            clock[0] = max(now, reqs[i].arrival)
            continue
        # step() is process_new_tasks() then update_slots(): the tasks first, so that the tasks in
        # the slots are known (only they can finish in this step) and a fast-forward can follow
        core.process_new_tasks()
        if actions:
            n_done += _answer_actions(actions, reqs, now)
        if just_launched:
            # the launch's own state copies (a RAM-cache load, the idle-slot saves) come before the slot
            # starts its prompt (`t_start_process_prompt`, slotlab.engine.core._start_prompt): the
            # server's prompt_ms leaves them out, TTFT does not
            t0 = now + speed.copy_time(mem.copied)
            for r in just_launched:
                r.prompt_start = t0
            just_launched.clear()
        running = [s.task for s in core.slots if s.task is not None]
        k = 0
        if ff is not None:
            nxt = reqs[i].arrival if i < n else inf
            if hold and all(s.is_processing for s in core.slots):
                nxt = inf  # an arrival now would only be held: it changes nothing in the server
            k, c = ff.advance(now, nxt)
            if k:
                clock[0] = c
                if pending_first:  # a prompt ended in its last step
                    for r in pending_first.values():
                        r.first = c
                    pending_first.clear()
                if all(not t.done for t in running):
                    continue
                # its last step ended slots: their tasks are done, recorded below as a plain step's.
                # A request that arrived by the start of that step met every slot busy (the fast-
                # forward runs past arrivals only then): the server deferred it before the step, so
                # it is held now, as the plain step's iteration would have held it, not new
                if hold:
                    while i < n and reqs[i].arrival <= ff.last_start:
                        held.append(i)
                        i += 1
        if not k:
            decoded.clear()
            decoded_out.clear()
            decoded_ctx.clear()
            decoded_kv.clear()
            step()  # its process_new_tasks() finds the queue empty
            dt = 0.0
            if ctx_cost:
                for nt, no, nc, nk in zip(decoded, decoded_out, decoded_ctx, decoded_kv):
                    dt += dt_of(nt, no, nc, nk)
            else:
                for nt, no in zip(decoded, decoded_out):
                    dt += dt_of(nt, no)
            if mem.copied:  # checkpoints, RAM-cache saves and loads since the last step
                dt += speed.copy_time(mem.copied)
                mem.copied = 0
            clock[0] = now + dt
            if pending_first:
                for r in pending_first.values():
                    r.first = clock[0]
                pending_first.clear()
        fin = False
        if actions:
            k = _answer_actions(actions, reqs, clock[0])
            n_done += k
            fin = k > 0
        for t in running:
            if t.done:
                r = by_task.get(t.id)
                if r is not None and r.end is None:
                    r.end = clock[0]
                    if r.launched is None:
                        r.launched = now
                    r.task = _summary(t)
                    core.tq.tasks.pop(t.id, None)  # the queue's registry keeps every task (and its prompt)
                    n_done += 1
                    fin = True
        if fin and progress is not None:
            w = time.perf_counter()
            if w - last_report > 0.2 or n_done == n:
                last_report = w
                progress(n_done, n, clock[0])
    if progress is not None:
        progress(n, n, clock[0])
    n_done += _answer_actions(actions, reqs, clock[0])
    for r in actions:  # never answered (cannot happen: the loop runs while a task is queued)
        r.task = _action_row(reqs[r.i].action, None, "not answered by the end of the trace", None)
    results = []
    for r, q in zip(recs, reqs):
        s = r.task
        d = {"i": r.i, "arrival": round(r.arrival, 6), **s,
             "queue_wait": None if r.launched is None else round(r.launched - r.arrival, 6),
             "ttft": None if r.first is None else round(r.first - r.arrival, 6),
             "prompt_s": None if r.first is None else round(r.first - (r.prompt_start if r.prompt_start is not None
                                                                      else r.launched), 6),
             "end": None if r.end is None else round(r.end, 6)}
        results.append(d)
    acts = [d for d in results if "action" in d]
    ok = [d for d in results if d["status"] == 200 and "action" not in d]
    waits = [d["queue_wait"] for d in ok if d["queue_wait"] is not None]
    ttfts = [d["ttft"] for d in ok if d["ttft"] is not None]
    reused = sum(d["cache_n"] for d in ok)
    prefilled = sum(d["prompt_n"] for d in ok)
    ok_mask = [d["status"] == 200 and "action" not in d for d in results]
    ideal = None
    if trace.block:  # the infinite bound over the same requests as the totals (a failed one in neither)
        from slotlab import ideal as I

        if bounds:
            bpt = mem.profile.bytes_per_token(params.cache_type_k, params.cache_type_v)
            ram = float("inf") if params.cache_ram < 0 else params.cache_ram * 2**20
            ideal = I.bounds(trace, ok_mask, mem.n_ctx * bpt + ram, bpt)
        bound = (ideal.reuse["infinite"].hit_tokens if ideal is not None else
                 I.infinite_hit_tokens(reqs, trace.block, ok_mask)[0])
    else:
        bound = 0
    totals = {
        "n_requests": n - len(acts), "n_ok": len(ok), "n_errors": n - len(acts) - len(ok),
        "sim_seconds": round(clock[0], 6), "wall_seconds": round(time.perf_counter() - wall0, 3),
        "prompt_tokens": reused + prefilled, "tokens_reused": reused, "tokens_prefilled": prefilled,
        "tokens_generated": sum(d["predicted_n"] for d in ok),
        "infinite_cache_tokens": bound if trace.block else None,
        "evictions": dict(evictions), "slot_clears": dict(clears),
        "peak_cache_bytes": max(alloc.peak_bytes, peak[0]),
        "disk_reads": disk[0], "disk_read_bytes": disk[1],
        "proposals": [p.name for p in active_proposals(params)],  # the changes to the build's rules it ran
        "queue_wait_p50": _pct(waits, 50), "queue_wait_p99": _pct(waits, 99),
        "ttft_p50": _pct(ttfts, 50), "ttft_p99": _pct(ttfts, 99),
        "speed": speed.source or f"t_fixed {speed.t_fixed:g} s, t_token {speed.t_token:g} s",
        "n_steps": mem.stats["decode"],
        "fast_forward_steps": ff.n_steps if ff is not None else 0,
        "fast_forwards": ff.n_bulk if ff is not None else 0,
    }
    if ideal is not None:
        totals["bounds"] = ideal.as_json()
    if acts:  # slot actions (slotlab traces): how many, and how many the server refused
        totals["n_actions"] = len(acts)
        totals["action_errors"] = sum(1 for d in acts if d["status"] != 200)
    return SimResult(list(flags), results, totals, eng, wall_s=time.perf_counter() - wall0)


def _tail(q) -> tuple[int, int, int] | None:
    """(last prompt token, prompt length, n_predict) of a request whose placeholders can be computed
    ahead (fastforward.Prechains): a prompt of token ids or blocks, a positive n_predict, no script."""
    if q.action is not None or (q.output is not None and len(q.output)):
        return None
    k = q.fields.get("n_predict", q.n_predict)
    if not isinstance(k, int) or k <= 0:
        return None
    t = q.tail()
    return None if t is None else (t[0], t[1], k)


def _post_order(held: "collections.deque[int]", new, n_idle: int) -> list[int]:
    """Which requests to post now, in order, when the simulator holds back those the server would
    only defer (all requests without `id_slot`), and update `held` (oldest first).

    The server, with the held requests as its deferred list D, would now have in its queue the r = min(
    idle slots, |D|) oldest of D, each put at the FRONT by one release (so the newest of them first),
    followed by the new arrivals; each launches while a slot is idle (an idle slot is always found
    without `id_slot`), the rest is deferred at the end of D. So: post those r in reverse order, then
    as many new arrivals as slots remain idle, and hold the others. Launch order, slots and every
    cache decision are the server's; only the deferral passes (task_queued at arrival, slot_skip x n,
    slot_decision with no slot, task_deferred, task_undeferred) are not emitted, and the task ids of
    requests launched in the same step can be numbered in another order."""
    r = min(n_idle, len(held))
    out = [held.popleft() for _ in range(r)][::-1]
    free = n_idle - r
    for j in new:
        if free > 0:
            out.append(j)
            free -= 1
        else:
            held.append(j)
    return out


def _answer_actions(actions: list, reqs, now: float) -> int:
    """The slot actions the server loop has answered by `now`: their records get the answer (the
    action's reply or error, in the golden schema's terms) and leave `actions`; how many."""
    k = 0
    for r in list(actions):
        t = r.task
        if not t.done:
            continue
        actions.remove(r)
        a = reqs[r.i].action
        r.launched = r.launched if r.launched is not None else now
        r.end = now
        r.task = (_action_row(a, t.error.code, _error_text(t.error), None) if t.error is not None else
                  _action_row(a, 200, None, dict(t.result)))
        k += 1
    return k


def _action_row(a: dict, status, error, reply) -> dict:
    """A slot action's result row: the action, its slot, status, error or reply (no token counts)."""
    return {"action": a["action"], "status": status, "id_slot": a.get("id_slot"), "cache_n": None, "prompt_n": None,
            "predicted_n": None, "error": error, "reply": reply}


def _error_text(err) -> str:
    return err.message if hasattr(err, "message") else str(err)


def _summary(task) -> dict:
    """What the report keeps of a finished task (the task itself, with its prompt, is dropped)."""
    if task.error is not None:
        return {"status": task.error.code, "id_slot": None, "cache_n": None, "prompt_n": None, "predicted_n": None,
                "error": _error_text(task.error)}
    res = task.result
    tm = res["timings"]
    return {"status": 200, "id_slot": res["id_slot"], "cache_n": tm["cache_n"], "prompt_n": tm["prompt_n"],
            "predicted_n": res["tokens_predicted"], "error": None}


def progress_bar(stream=None) -> Callable[[int, int, float], None]:
    stream = stream if stream is not None else sys.stderr  # at call time: whoever replaced sys.stderr since import
    tty = stream.isatty()
    t0 = time.perf_counter()

    def show(i: int, n: int, clock: float) -> None:
        if not tty and i < n:
            return
        bar = "#" * (30 * i // max(n, 1))
        el = time.perf_counter() - t0
        print(f"\rsimulating {i:6d}/{n} [{bar:<30}] sim {clock:9.1f} s, wall {el:6.1f} s", end="" if i < n else "\n",
              file=stream, flush=True)

    return show
