"""Generation fast-forward: k server steps of pure generation at once, with the decisions of k steps.

Most steps of a simulation only generate: every busy slot is in GENERATING, nothing is queued, and
one `update_slots` decodes one token per slot and samples the next. Between two events that can
change a decision — an arrival, a slot finishing its generation (n_predict, the context limit, an
end-of-generation token), the KV pool filling up — those steps are all alike, so `FastForward.advance`
does k of them in one go:

* the tokens each slot's sampler would return (the paper memory's placeholders, a function of the fed
  token, its position and the seed; or the request's scripted output) are computed as a chain;
* the paper memory appends the k cells per slot in bulk (`PaperMemory.advance_generation`, which stops
  before a step whose decode would fail for lack of cells; `PaperContext.advance_tokens` replays a
  sliding-window cache's cell reuse and purges, and runs the real per-step decode only where
  several generating sequences share one window cache);
* the slots get their tokens, `sampled`, `generated`, `stats.n_gen`, and the metrics the counters k
  decodes would have added (`n_decode_total`, `n_busy_slots_total`, `n_tokens_max`,
  `tokens_predicted_total`); `on_token` is called per token as `process_token` would.

k is the largest number of steps such that, stepped one by one, none of them would submit an arrival
(the clock before each stays below the next arrival), finish a slot (n_predict reached, context limit,
an end-of-generation token) before the last of them, or hit a full KV pool. The last step may finish
slots: its tokens are accepted by the core itself (`accept_token`'s stop rules, then
`send_final_response` and `release`, slot by slot as `post_decode` runs them).

The placeholders come from `Prechains` where it has them: every request's chain computed before it
runs, many requests at a time in numpy (`PaperVocab.chains`), used only where the start and the
token at the position are checked to be the sampler's.

Prompts too (`_advance_prompt`): the step that starts one (`_start_and_advance`: the core's own
`_start_prompt`, with its cache, --cache-reuse and checkpoint decisions, and the `memory_seq_rm` of
`_process_prompt`, run first; the state copied since the last step charged to that step) and the
further `-b` chunks, which decide nothing, as long as no checkpoint can be created in it and no
waiting slot would start in the step. Where the memory needs checkpoints (a sliding window, a recurrent part), a chunk
is cut as `checkpoints.cut` cuts it, and the steps stop before the first chunk that `_process_prompt`
would leave with do_checkpoint on (one that ends the prompt, ends within n_ubatch of its end, or
starts at a user message) unless it is the first step: then its `maybe_create` runs before the
memory is advanced, as it runs before the server's decode, on a step `PaperMemory.step_fits` says
cannot fail, its state copy is charged to that step's time (`copy_time`), and a checkpoint made
ends the fast-forward there (it changes how the next chunks are cut). The batch of each step is planned as `pre_decode` fills it (one token per
generating slot, then the prompt slots in slot order while there is room), up to and including the
step in which a prompt ends and its first token is sampled (unless that token ends the request, or
the slot makes checkpoints), and
`PaperMemory.advance_steps` applies the batches. Each chunk emits its `prompt_seq_rm` / `prompt_batch`
as `_process_prompt` does.

The step that ends a slot beside a prompt being processed, and every step with two starting prompts
(or one beside a prompt being processed), a queued task, a stop word, speculative decoding, a sampler
it does not know or state copied since the last step outside a start (its time is charged to the next
plain step), is left to the plain `ServerCore.step()`. So every decision is the plain stepping's
(tests/sim/test_fastforward.py and test_prompt_bulk.py compare both modes request by request and
RAM-cache decision by decision).

What changes in the event stream: per fast-forward, ONE `decode` event (off 0, n_tokens = all tokens
of the k steps, n_prompt their prompt tokens, `ms` the wall time of the bulk, `_steps` = k) instead
of k, and one `slot_snapshot` per changed slot (its state after the k steps) instead of one per slot
per step. A view scrubbing through time sees generation jump by k tokens; every other event is
emitted as before."""

from __future__ import annotations

import time

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.slot import SlotState, now_us
from slotlab.memory import require_seq_rm
from slotlab.memory.paper import PaperMemory, PaperSampler, PaperVocab
from slotlab.sim.memory import ScriptSampler

__all__ = ["FastForward"]

_GEN = SlotState.GENERATING
_IDLE = SlotState.IDLE
_PROMPT = SlotState.PROCESSING_PROMPT
_STARTED = SlotState.STARTED


class Prechains:
    """The placeholders the requests of a trace will generate, computed before they run, many at once.

    A paper memory's placeholder is a function of the previous token, its position and the seed, so
    request i, whose prompt of n tokens ends in token t, generates `chain(t, n - 1, seed, n_predict)`
    whatever slot it runs in, as long as its positions simply continue. Those chains are computed
    per block of `block` requests in one vectorized pass (`PaperVocab.chains`: ~60 ms for the 4.1 M
    tokens of the Mooncake conversation trace, against ~2 s token by token) when the fast-forward first
    needs one of the block, for the seed it then needs; the last few blocks are kept.

    A chain is only ever used where it is provably the one the sampler gives: the start is checked
    against the task's own prompt (last token, length), and every later use against the token the
    slot holds at that position; anything else (another seed, a shifted context, a script, a chain
    running past n_predict) is computed as before. So the tokens, and every decision, are unchanged."""

    def __init__(self, vocab: PaperVocab, reqs, tail, block: int = 2048, keep: int = 3):
        # tail(reqs[i]): (last prompt token, n_prompt, n_predict), or None where it is not known ahead
        self.vocab, self.reqs, self.tail = vocab, reqs, tail
        self.block, self.keep = block, keep
        self._tails: dict[int, list] = {}  # block -> its requests' tails
        self._blocks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def get(self, i: int, seed: int, last: int, n: int) -> np.ndarray | None:
        """Request i's chain for `seed`, if its prompt ends in `last` and has `n` tokens (else None)."""
        if not 0 <= i < len(self.reqs):
            return None
        c, j = divmod(i, self.block)
        tails = self._tails.get(c)
        if tails is None:
            tails = self._tails[c] = [self.tail(q) for q in self.reqs[c * self.block:(c + 1) * self.block]]
            while len(self._tails) > self.keep:
                del self._tails[next(iter(self._tails))]
        tl = tails[j]
        if tl is None or tl[0] != last or tl[1] != n:
            return None
        key = (c, seed)
        b = self._blocks.get(key)
        if b is None:
            ts = [t or (0, 1, 0) for t in tails]
            b = self._blocks[key] = self.vocab.chains([t[0] for t in ts], [t[1] - 1 for t in ts], seed,
                                                      [t[2] for t in ts])
            while len(self._blocks) > self.keep:
                del self._blocks[next(iter(self._blocks))]
        out, starts = b
        return out[starts[j]:starts[j] + tl[2]]


def _probs(s) -> bool:
    """The slot's request asks for token probabilities (process_token records them per token)."""
    sp = getattr(s.task.params, "sampling", None)
    return sp is not None and getattr(sp, "n_probs", 0) > 0


class FastForward:
    """Fast-forwards the generation of `core` (a `ServerCore` on a `PaperMemory`); step time `dt_of(n, n_outputs)`
    for a decode of n tokens and `clocks_of` for runs of generation steps (the simulator's speed model:
    `decode_time`, `step_clocks`)."""

    def __init__(self, core, dt_of, clocks_of, *, min_steps: int = 2, first_token_only=None, copy_time=None):
        self.core, self.mem, self.dt_of = core, core.memory, dt_of
        # clocks_of(now, b, x0, n, ctx): the clocks after n generation steps at once, equal to adding
        # dt_of's one by one (`SpeedModel.step_clocks`)
        self.clocks_of = clocks_of
        # the time of copying n bytes of state (a checkpoint made in a fast-forward's first step is
        # charged to that step, as the simulator charges a plain step's copies); None: no checkpoint
        # is made in a fast-forward
        self.copy_time = copy_time
        self.ctx_cost = False  # pass each step's context (dt_of's n_ctx) for a speed model with t_ctx
        self.first_token_only = first_token_only  # an on_token callback that ignores all but the first token
        self.min_steps = max(1, int(min_steps))
        self.ok = isinstance(self.mem, PaperMemory) and core.spec is None and self.mem.dft is None
        self.n_bulk = 0  # fast-forwards done
        self.n_steps = 0  # steps they covered
        # the clock at which the last generation fast-forward's last step started: a request that arrived
        # by then was deferred by the server before that step (the simulator holds it: see simulate)
        self.last_start = 0.0
        # the placeholders of the trace's requests computed ahead (`Prechains`), and the request index
        # of a task (the simulator's); per task its chain once found: {task id: (task, chain, n, seed) | None}
        self.pre: Prechains | None = None
        self.index_of = None
        self._pre: dict[int, tuple | None] = {}

    def _chains(self, gen, k: int, end: int = 0) -> tuple[list | None, int]:
        """Each generating slot's next `k` tokens, and how many steps they allow: the step that samples
        an end-of-generation token ends its slot, so the fast-forward stops before it (`end` = 1: at
        it, the step that may end slots being the fast-forward's last). None when a slot has no chain
        (plain stepping handles it)."""
        chains = []
        vocab = self.core.vocab
        # A PaperVocab's only end-of-generation id is `eog` (its is_eog compares with it), so the first
        # one in a chain is found by list.index, in C, instead of one is_eog call per token (a chain
        # per slot per fast-forward: every generated token of a simulation). Any other vocabulary is
        # asked token by token.
        eog = vocab.eog if getattr(type(vocab), "is_eog", None) is PaperVocab.is_eog else None  # (a wrapper may delegate)
        is_eog = vocab.is_eog
        for s in gen:
            ch = self._chain(s, k)  # k: shortened by an earlier slot's end-of-generation, if any
            if ch is None:
                return None, k
            if eog is not None:
                if eog in ch:  # that step ends the slot: stop before it (or at it)
                    k = min(k, ch.index(eog) + end)
            else:
                for j, t in enumerate(ch):
                    if is_eog(t):
                        k = min(k, j + end)
                        break
            chains.append(ch)
        return chains, k

    def _chain(self, s, k: int, first: bool = False) -> list[int] | None:
        """The k tokens slot `s`'s sampler returns over the next k steps (None: unknown sampler).
        `first`: the slot is finishing its prompt, and the first token is sampled after its last
        prompt token (the chain then starts there, and the script is looked up as `sample` would)."""
        sp = s.sampler
        script = None
        if isinstance(sp, ScriptSampler):
            if not sp.resolved and not first:
                return None
            script, n0 = sp.script()  # (looked up as its first sample() would)
            base = sp.base
        else:
            base = sp
        if not isinstance(base, PaperSampler) or base.mem is not self.mem or not isinstance(self.mem.gen_vocab, PaperVocab):
            return None
        if first:  # the row that gets logits: the prompt's last token
            tok, pos = int(s.task.tokens[-1]), s.task.n_tokens - 1
        else:
            tok, pos = int(s.sampled), s.tokens.pos_next()
        if script is None and self.pre is not None:
            ch = self._prechain(s.task, tok, pos, int(base.seed) ^ self.mem.seed, k)
            if ch is not None:
                return ch
        n_script = 0 if script is None else max(0, min(k, len(script) - n0))
        out = [int(x) for x in script[n0:n0 + n_script]] if n_script else []
        if n_script:
            tok = out[-1]
        # PaperMemory.vocab_gen(tok, pos, seed) = PaperVocab.generated(tok, pos, seed ^ mem.seed), k - n_script times
        return self.mem.gen_vocab.chain(tok, pos + n_script, int(base.seed) ^ self.mem.seed, k - n_script, out)

    def _prechain(self, task, tok: int, pos: int, seed: int, k: int) -> list[int] | None:
        """`chain(tok, pos, seed, k)` from the precomputed chain of `task`'s request, where it provably
        is that: the chain G starts after the prompt's last token at n - 1, so G[j:j + k] is the
        chain after token G[j - 1] (the prompt's last token for j = 0) at position n - 1 + j."""
        e = self._pre.get(task.id, False)
        if e is False:
            e = None
            i = self.index_of(task) if self.index_of is not None else None
            if i is not None:
                n = task.n_tokens
                g = self.pre.get(i, seed, int(task.tokens[-1]), n)
                if g is not None:
                    e = (task, g, n, seed)
            if len(self._pre) > 64:  # forget the finished tasks' chains
                self._pre = {t: v for t, v in self._pre.items() if v is not None and not v[0].done}
            self._pre[task.id] = e
        if e is None or e[3] != seed:
            return None
        _, g, n, _ = e
        j = pos - n + 1
        if j < 0 or j + k > len(g) or (int(g[j - 1]) != tok if j else int(task.tokens[-1]) != tok):
            return None
        return g[j:j + k].tolist()

    def advance(self, now: float, next_arrival: float) -> tuple[int, float]:
        """Fast-forward from clock `now` if the server is only generating. Returns (steps done, the
        clock after them); (0, now) when a plain step must run (nothing was changed).

        A generation fast-forward may end with the step in which slots finish (n_predict, the context
        limit, an end-of-generation token): that last step's tokens are accepted by the core itself
        (`accept_token`, whose stop rules decide, then `send_final_response` and `release` for a
        slot that stops, in slot order as `post_decode` runs them), so its tasks are done when this
        returns."""
        core = self.core
        if not self.ok or core.tq.queue or core.tq.cancels:
            return 0, now
        gen, prm = [], []  # prm: the slots with a prompt to process, in slot order (STARTED ones included)
        kmax = 1 << 62
        for s in core.slots:
            st = s.state
            if st is _IDLE:
                continue
            if st is _STARTED or (st is _PROMPT and not s.task.params.stop
                                  and getattr(s.task.params, "sampling", None) is None):
                prm.append(s)
                continue
            if st is not _GEN or s.spec_draft or s.task.params.stop:
                return 0, now
            lim = s.n_ctx - len(s.tokens) - 2  # process_token stops when len(tokens) + 1 >= n_ctx
            if s.n_predict_max != -1:
                lim = min(lim, s.n_predict_max - s.stats.n_gen - 1)  # the step that reaches n_predict
            if lim < kmax:
                kmax = lim
            gen.append(s)
        b = len(gen)
        if len(prm) == 1 and prm[0].state is _STARTED:  # one prompt to start: its step may be fast-forwarded
            return self._start_and_advance(now, next_arrival, gen, prm, kmax)
        if getattr(self.mem, "copied", 0):  # state copied since the last step (a launch's cache load...):
            return 0, now  # the simulator charges it to the next plain step's time
        if any(s.state is _PROMPT for s in prm):
            return self._advance_prompt(now, next_arrival, gen, prm, kmax)
        if prm:  # slots about to start: the next step starts them
            return 0, now
        if not b or b > self.mem.n_batch or any(_probs(s) for s in gen):
            return 0, now
        kend = kmax + 1  # steps up to and including the first that may end a slot (its stop rules run in the core)
        if kend < self.min_steps:
            return 0, now
        # the clock: plain stepping adds dt per step and submits an arrival before the first step
        # whose starting clock has reached it
        p0 = sum(s.tokens.pos_next() for s in gen) if self.ctx_cost else 0  # step j: each row j deeper
        k, clocks = self._gen_clocks(now, next_arrival, b, p0, kend)
        if k < self.min_steps:
            return 0, now
        chains, k = self._chains(gen, k, end=1)
        if chains is None:
            return 0, now
        if k < self.min_steps:
            return 0, now
        t0 = time.perf_counter()
        feed = np.empty((k, b), dtype=np.int32)
        for c_, (s, ch) in enumerate(zip(gen, chains)):
            feed[0, c_] = s.sampled
            feed[1:, c_] = ch[:k - 1]
        m = self.mem.advance_generation([s.id for s in gen], [s.tokens.pos_next() for s in gen], feed)
        if m == 0:  # the first step would not fit in the KV pool: plain stepping handles it
            return 0, now
        k = m  # the memory applied m steps: the slots follow it
        # the slots, as k times pre_decode (push the fed token) + post_decode (sample, accept_token):
        # the first k - 1 steps here (no slot ends in them), the last one's tokens through the core
        tnow = now_us()
        met = core.metrics
        j = k - 1
        for c_, (s, ch) in enumerate(zip(gen, chains)):
            s.tokens.extend(feed[:k, c_])
            if j:
                toks = ch[:j]
                st = s.stats
                cb = s.task.on_token
                if cb is None or cb is self.first_token_only:  # a generating slot has its first token
                    s.generated.extend(toks)
                else:
                    for t in toks:  # process_token: record, then tell the listener
                        s.generated.append(t)
                        cb(s.task, t)
                s.sampled = toks[-1]
                st.n_gen += j
                st.t_gen_last = tnow
            s.i_batch = -1
        met.tokens_predicted_total += j * b
        met.on_decode(core.slots, k)  # (every slot still busy, as metrics_post_decode sees them)
        for s, ch in zip(gen, chains):  # post_decode of the last step, in slot order
            if not core.accept_token(s, ch[j]):
                core.send_final_response(s)
                core.release(s)
        if core.emit.wanted(T.DECODE):
            core.emit(T.Decode(off=0, n_tokens=k * b, n_prompt=0, ms=(time.perf_counter() - t0) * 1e3, _steps=k), "")
        core.emit_snapshots()
        self.n_bulk += 1
        self.n_steps += k
        self.last_start = clocks[k - 2] if k > 1 else now
        return k, clocks[k - 1]

    def _gen_clocks(self, now: float, next_arrival: float, b: int, p0: int, kend: int):
        """(k, clocks): how many steps of `b` generating rows (at summed depth `p0` before the first;
        0: no attention terms) run before an arrival or `kend`, and the clock after each: step j + 1
        runs while the clock after step j is below `next_arrival` (plain stepping submits the arrival
        before the first step that starts at or after it). With the speed model's `step_clocks`, in
        numpy chunks that grow until one reaches the arrival."""
        dt_of = self.dt_of
        parts = []
        # the first chunk: as many steps as the first step's time fits before the arrival (later steps
        # are no shorter), so one numpy pass is usually all
        dt0 = dt_of(b, b, p0, p0) if p0 else dt_of(b, b)
        gap = next_arrival - now
        m = 8192 if not gap < 8192 * dt0 else max(8, int(gap / dt0) + 2) if dt0 > 0 else 8192
        n, c = 0, now
        while True:
            m = min(m, kend - n)
            cl = self.clocks_of(c, b, p0 + n * b, m, bool(p0))
            parts.append(cl)
            j = int(np.searchsorted(cl, next_arrival))  # the first clock at or past the arrival
            if j < m:
                n += j + 1
                break
            n += m
            if n >= kend:
                break
            c = float(cl[-1])
            m *= 4
        return n, (parts[0] if len(parts) == 1 else np.concatenate(parts)).tolist()

    def _checkpoint_step(self, adds, ck) -> None:
        """Step 0's chunks as `_process_prompt` adds them, the checkpoint slot's `maybe_create` right
        after its own chunk (before the decode, on the memory as it is), and its copy charged: the
        planned clock has it, so the simulator must not charge it again."""
        cs, _, n_have, flag, _ = ck
        for s, a in adds:
            self._add_chunk(s, a)
            if s is cs:
                self.core.checkpoints.maybe_create(s, a, n_have, flag)
        self.mem.copied = 0

    def _add_chunk(self, s, a: int) -> None:
        """One prompt chunk of `a` tokens as `_process_prompt` adds it: its `prompt_seq_rm` (the memory
        has nothing at or after the slot's end, so no seq_rm is needed), the tokens, the stats, its
        `prompt_batch`."""
        emit = self.core.emit
        p0 = len(s.tokens)
        if emit.wanted(T.PROMPT_SEQ_RM):
            emit(T.PromptSeqRm(), f"cached n_tokens = {p0}, memory_seq_rm [{p0}, end)", slot=s)
        s.tokens.extend(s.task.tokens[p0:p0 + a])
        if s.stats.is_set():
            s.stats.n_prompt_processed += a
        if emit.wanted(T.PROMPT_BATCH):
            emit(T.PromptBatch(n_added=a, n_tokens=len(s.tokens), n_prompt=s.task.n_tokens), "", slot=s)

    # -- prompts ---------------------------------------------------------------------------------------

    def _start_and_advance(self, now: float, next_arrival: float, gen: list, prm: list, kmax: int) -> tuple[int, float]:
        """The step that starts slot prm[0]'s prompt, and the prompt steps after it, beside generating
        slots. The start is the core's own: `_start_prompt` (n_past, --cache-reuse, the checkpoint
        rewind, the full-match rule), then the `memory_seq_rm [p0, end)` of `_process_prompt`, under
        `iterate` as `pre_decode` runs them; then `_advance_prompt` plans the chunks from the slot as
        the start left it, the state copied since the last step (the launch's RAM-cache save and
        load, a checkpoint restored) charged to the first step as the simulator charges a plain
        step's.

        Checked before anything changes: nothing else waits to start, and the task has neither stop
        words nor its own sampler. If the start ends the task, or `_advance_prompt` declines (an
        unknown sampler, a generating slot that ends in the step, no room in the batch, a copy the
        simulator cannot time), nothing else was done: the plain step that follows finds the slot
        started (no event of it emitted twice: the chunk's `prompt_seq_rm` comes with the chunk) and
        decodes as it would have, so those are not checked twice here. Why the order may change: in
        the server the generating slots' tokens go into the batch first, which neither reads nor
        changes what the start reads (its own slot and sequence)."""
        core, s = self.core, prm[0]
        if s.task.params.stop or getattr(s.task.params, "sampling", None) is not None:
            return 0, now
        started = []

        def start(slot) -> None:
            if not core._start_prompt(slot):
                return
            p0 = slot.tokens.pos_next()
            try:
                require_seq_rm(core.memory, slot.id, p0, -1)
            except Exception:  # noqa: BLE001 - as _process_prompt: its event, then iterate's
                core.emit(T.PromptSeqRm(), f"cached n_tokens = {len(slot.tokens)}, memory_seq_rm [{p0}, end)",
                          slot=slot)
                raise
            started.append(slot)

        core.iterate([s], start)
        copied = getattr(self.mem, "copied", 0)  # since the last step: the launch's, and the start's (a restore)
        if not started or s.state is not _PROMPT or (copied and self.copy_time is None):
            return 0, now
        return self._advance_prompt(now, next_arrival, gen, prm, kmax, copied=copied)

    def _advance_prompt(self, now: float, next_arrival: float, gen: list, prm: list, kmax: int,
                        copied: int = 0) -> tuple[int, float]:
        """Steps that process prompt chunks (slots in PROCESSING_PROMPT), beside generating slots: up to
        and including the step in which a prompt ends (its first token sampled), unless that token
        ends the slot; never past a slot's finishing step, an arrival, or a full KV pool. Each chunk
        is what `_process_prompt` would add (the batch filled in slot order after one token per
        generating slot) and emits its `prompt_seq_rm` / `prompt_batch` as there; the decodes and
        snapshots are summarized as in a generation fast-forward."""
        core, mem = self.core, self.mem
        if not core.params.cont_batching and gen:
            return 0, now
        gate, cut = core.checkpoints.gate, core.checkpoints.cut
        gated = {s.id for s in prm if s.state is _PROMPT and gate(s.task)}  # do_checkpoint: see below
        n_batch, n_ubatch = mem.info.n_batch, mem.info.n_ubatch
        b = len(gen)
        if b > n_batch:
            return 0, now
        # plan the steps: which chunk each prompt slot gets, and the clock
        rem = {s.id: s.task.n_tokens - len(s.tokens) for s in prm if s.state is _PROMPT}
        plan: list[list[tuple[object, int]]] = []
        sizes: list[int] = []
        clocks: list[float] = []
        c = now
        first = None  # the slot whose prompt ends in the last planned step, and its first token
        ck = None  # (slot, chunk, n_have, near_end_or_last_user, bytes): the checkpoint step 0 makes
        while len(plan) < kmax and (not plan or c < next_arrival):
            bn = b
            adds = []
            for s in prm:  # pre_decode: slot order, while the batch has room
                if bn >= n_batch:
                    break
                if s.state is _STARTED:  # it would start in this step (_start_prompt decides): not here
                    adds = []
                    break
                a = min(rem[s.id], n_batch - bn)
                if a > 0 and s.id in gated:
                    # do_checkpoint: the chunk is cut as _process_prompt cuts it, and the step is fast-
                    # forwarded only if it decides nothing there: the prompt goes on after it, and the
                    # chunk neither starts at a user message nor ends within n_ubatch of the prompt end
                    # (do_checkpoint is then switched off, so maybe_create is not called)
                    n_prompt = s.task.n_tokens
                    n_have = n_prompt - rem[s.id]
                    spans = s.task.params.message_spans
                    a = cut(s, spans, n_prompt, n_have, a)
                    near_end = n_prompt < n_have + a + n_ubatch
                    if n_have + a >= n_prompt or near_end or spans.is_user_start(n_have):
                        # do_checkpoint stays on: maybe_create runs before the step's decode, so only
                        # the first step may do it (on the memory as it is now), once, where the
                        # decode cannot fail after it (step_fits, checked below)
                        if plan or ck is not None or self.copy_time is None:
                            adds = []
                            break
                        flag = near_end or n_have == spans.last_user_message_pos()
                        nb = (mem.state_size(s.id, partial=True)
                              if core.checkpoints.would_create(s, n_have, flag) else 0)
                        ck = (s, a, n_have, flag, nb)
                if a > 0:
                    adds.append((s, a))
                    bn += a
            if not adds:
                ck = None if not plan else ck
                break  # nothing left to prefill here (a plain step will tell)
            done = [s for s, a in adds if a == rem[s.id]]
            if done:
                if len(done) > 1:
                    break  # two prompts ending at once: left to plain stepping
                s = done[0]
                ch = self._chain(s, 1, first=True)
                if ch is None:
                    break
                tok = ch[0]
                # process_token after the first sample: context limit, budget (n_gen = 1), end of generation
                if (s.task.n_tokens + 1 >= s.n_ctx or (s.n_predict_max != -1 and s.n_predict_max <= 1)
                        or core.vocab.is_eog(tok)):
                    break
                first = (s, tok)
            for s, a in adds:
                rem[s.id] -= a
            plan.append(adds)
            sizes.append(bn)
            if self.ctx_cost:  # the context each row's sequence holds: generating rows, then the chunks
                j = len(plan) - 1
                ng = sum(g.tokens.pos_next() + j for g in gen)
                starts = [(a, s.task.n_tokens - rem[s.id] - a) for s, a in adds]
                dt = self.dt_of(bn, b + len(done), ng + sum(a * p for a, p in starts), ng + sum(p for _, p in starts))
            else:
                dt = self.dt_of(bn, b + len(done))  # the generating slots' outputs, and the prompt's last
            if len(plan) == 1:  # the simulator's plain step: now + (decodes + copies), the copies in one sum
                nbytes = copied + (ck[4] if ck is not None else 0)
                if nbytes:
                    dt += self.copy_time(nbytes)
            c += dt
            clocks.append(c)
            if first is not None:
                break
            if ck is not None and ck[4]:
                break  # the checkpoint it makes changes how later chunks are cut (checkpoints.cut reads them)
        k = len(plan)
        if k == 0:
            return 0, now
        chains, k = self._chains(gen, k)
        if chains is None:
            return 0, now
        if k < len(plan):
            first = None  # the step that would end a prompt is cut
            plan, sizes, clocks = plan[:k], sizes[:k], clocks[:k]
        if k == 0:
            return 0, now
        # the batches, in the server's row order: one token per generating slot, then the chunks
        t0 = time.perf_counter()
        steps, logits = [], []
        n_have = {s.id: len(s.tokens) for s in prm if s.state is _PROMPT}
        gen_pos = [s.tokens.pos_next() for s in gen]
        gen_rows = list(range(b))
        for j, adds in enumerate(plan):
            runs = [(s.id, [s.sampled if j == 0 else ch[j - 1]], p + j) for s, ch, p in zip(gen, chains, gen_pos)]
            want = gen_rows
            row = b
            for s, a in adds:
                h = n_have[s.id]
                runs.append((s.id, s.task.tokens[h:h + a], h))
                n_have[s.id] = h + a
                row += a
                if first is not None and s is first[0] and j == k - 1:
                    want = gen_rows + [row - 1]  # the prompt's last row: the first sample reads it
            steps.append(runs)
            logits.append(want)
        if ck is not None:
            # the checkpoint first (it reads the memory before the decode), on a step that cannot fail
            if not mem.step_fits(steps[0]):
                return 0, now
            self._checkpoint_step(plan[0], ck)
        m = mem.advance_steps(steps, logits)
        if m == 0:
            if ck is not None:
                raise AssertionError("a fast-forward step predicted to fit did not (after its checkpoint)")
            return 0, now
        if copied:
            mem.copied = 0  # charged to the first step's time above
        if m < k:
            first = None
            k = m
        # the slots, as k times pre_decode + post_decode
        tnow = now_us()
        met = core.metrics
        emit = core.emit
        n_prompt = sum(a for _, a in plan[0]) if ck is not None else 0
        for adds in plan[1:k] if ck is not None else plan[:k]:
            for s, a in adds:  # _process_prompt
                self._add_chunk(s, a)
                n_prompt += a
        for c_, (s, ch) in enumerate(zip(gen, chains)):
            s.tokens.extend([s.sampled] + ch[:k - 1])
            toks = ch[:k]
            cb = s.task.on_token
            if cb is None or cb is self.first_token_only:
                s.generated.extend(toks)
            else:
                for t in toks:
                    s.generated.append(t)
                    cb(s.task, t)
            s.sampled = toks[-1]
            s.stats.n_gen += k
            s.stats.t_gen_last = tnow
            s.i_batch = -1
        met.tokens_predicted_total += k * b
        if first is not None:  # its prompt is done: DONE_PROMPT, then post_decode samples its first token
            s, tok = first
            s.stats.n_gen = 0
            s.state = _GEN  # DONE_PROMPT -> GENERATING in post_decode, which samples it
            s.i_batch = -1
            core.accept_token(s, tok)
            if not s.has_next_token:
                raise AssertionError(f"slot {s.id}: the first token was predicted not to end it")
        met.on_decode(core.slots, k)
        dt = time.perf_counter() - t0
        met.on_prompt(n_prompt, dt)
        if emit.wanted(T.DECODE):
            emit(T.Decode(off=0, n_tokens=sum(sizes[:k]), n_prompt=n_prompt, ms=dt * 1e3, _steps=k), "")
        core.emit_snapshots()
        self.n_bulk += 1
        self.n_steps += k
        return k, clocks[k - 1]

