"""Generation fast-forward: k server steps of pure generation at once, with the decisions of k steps.

Most steps of a simulation only generate: every busy slot is in GENERATING, nothing is queued, and
one `update_slots` decodes one token per slot and samples the next. Between two events that can
change a decision — an arrival, a slot finishing its generation (n_predict, the context limit, an
end-of-generation token), the KV pool filling up — those steps are all alike, so `FastForward.advance`
does k of them in one go:

* the tokens each slot's sampler would return (the paper memory's placeholders, a function of the fed
  token, its position and the seed; or the request's scripted output) are computed as a chain;
* the paper memory appends the k cells per slot in bulk (`PaperMemory.advance_generation`, which stops
  before a step whose decode would fail for lack of cells, and runs the real per-step decode on a
  sliding-window memory);
* the slots get their tokens, `sampled`, `generated`, `stats.n_gen`, and the metrics the counters k
  decodes would have added (`n_decode_total`, `n_busy_slots_total`, `n_tokens_max`,
  `tokens_predicted_total`); `on_token` is called per token as `process_token` would.

k is the largest number of steps such that, stepped one by one, none of them would submit an arrival
(the clock before each stays below the next arrival), finish a slot (n_predict reached, context limit,
an end-of-generation token) or hit a full KV pool. The step that ends a slot, and every step with a
prompt, a queued task, a stop word, speculative decoding or a sampler it does not know, is left to
the plain `ServerCore.step()`. So every decision is the plain stepping's (tests/sim/test_fastforward.py
compares both modes request by request and RAM-cache decision by decision).

What changes in the event stream: per fast-forward, ONE `decode` event (off 0, n_tokens = k x slots,
n_prompt 0, `ms` the wall time of the bulk, `_steps` = k) instead of k, and one `slot_snapshot` per
generating slot (its state after the k steps) instead of one per slot per step. A view scrubbing
through time sees generation jump by k tokens; every other event is emitted as before."""

from __future__ import annotations

import time

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.slot import SlotState, now_us
from slotlab.memory.paper import _M64, PaperMemory, PaperVocab, _PaperSampler
from slotlab.sim.memory import _ScriptSampler

__all__ = ["FastForward"]

_GEN = SlotState.GENERATING
_IDLE = SlotState.IDLE


class FastForward:
    """Fast-forwards the generation of `core` (a `ServerCore` on a `PaperMemory`); step time `dt_of(n)`
    for a decode of n tokens (the simulator's speed model)."""

    def __init__(self, core, dt_of, *, min_steps: int = 2, first_token_only=None):
        self.core, self.mem, self.dt_of = core, core.memory, dt_of
        self.first_token_only = first_token_only  # an on_token callback that ignores all but the first token
        self.min_steps = max(1, int(min_steps))
        self.ok = isinstance(self.mem, PaperMemory) and core.spec is None and self.mem.dft is None
        self.n_bulk = 0  # fast-forwards done
        self.n_steps = 0  # steps they covered

    def _chain(self, s, k: int) -> list[int] | None:
        """The k tokens slot `s`'s sampler returns over the next k steps (None: unknown sampler)."""
        sp = s.sampler
        script = None
        if isinstance(sp, _ScriptSampler):
            if sp._script is False:
                return None
            script, base = sp._script, sp.base
            n0 = len(sp._slot.generated)
        else:
            base = sp
        if not isinstance(base, _PaperSampler) or base.mem is not self.mem or not isinstance(self.mem._gen, PaperVocab):
            return None
        # PaperMemory.vocab_gen(tok, pos, seed) = PaperVocab.generated(tok, pos, seed ^ mem.seed), inlined
        pv = self.mem._gen
        lo, ng = pv.gen_lo, pv.n_generated
        M = _M64
        sk = (int(base.seed) ^ self.mem.seed) * 0x8CB92BA72F3D8DD7 + 1
        tok, pos = int(s.sampled), s.tokens.pos_next()
        n_script = 0 if script is None else max(0, min(k, len(script) - n0))
        out = [int(x) for x in script[n0:n0 + n_script]] if n_script else []
        if n_script:
            tok = out[-1]
        for j in range(n_script, k):
            x = (tok * 0x9E3779B97F4A7C15 + (pos + j) * 0xD1B54A32D192ED03 + sk) & M
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
            tok = lo + (x ^ (x >> 31)) % ng
            out.append(tok)
        return out

    def advance(self, now: float, next_arrival: float) -> tuple[int, float]:
        """Fast-forward from clock `now` if the server is only generating. Returns (steps done, the
        clock after them); (0, now) when a plain step must run (nothing was changed)."""
        core = self.core
        if not self.ok or core.tq.queue or core.tq.cancels:
            return 0, now
        gen = []
        kmax = 1 << 62
        for s in core.slots:
            st = s.state
            if st is _IDLE:
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
        if not b or kmax < self.min_steps or b > self.mem.n_batch:
            return 0, now
        # the clock: plain stepping adds dt per step and submits an arrival before the first step
        # whose starting clock has reached it
        dt = 0.0
        dt += self.dt_of(b)
        clocks = [now + dt]
        c = clocks[0]
        k = 1
        while k < kmax and c < next_arrival:
            c += dt
            clocks.append(c)
            k += 1
        if k < self.min_steps:
            return 0, now
        chains = []
        is_eog = core.vocab.is_eog
        for s in gen:
            ch = self._chain(s, k)
            if ch is None:
                return 0, now
            for j, t in enumerate(ch):
                if is_eog(t):  # that step ends the slot: stop before it
                    k = j
                    break
            chains.append(ch)
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
        # the slots, as k times pre_decode (push the fed token) + post_decode (sample, _accept)
        tnow = now_us()
        met = core.metrics
        for c_, (s, ch) in enumerate(zip(gen, chains)):
            s.tokens.extend(feed[:k, c_])
            toks = ch[:k]
            st = s.stats
            cb = s.task.on_token
            if cb is None or cb is self.first_token_only:  # a generating slot has its first token
                s.generated.extend(toks)
            else:
                for t in toks:  # process_token: record, then tell the listener
                    s.generated.append(t)
                    cb(s.task, t)
            s.sampled = toks[-1]
            st.n_gen += k
            st.t_gen_last = tnow
            s.i_batch = -1
        met.tokens_predicted_total += k * b
        met.n_decode_total += k
        met.n_busy_slots_total += k * sum(1 for s in core.slots if s.is_processing)
        met.n_tokens_max = max([met.n_tokens_max] + [len(s.tokens) for s in core.slots])
        core.emit(T.DECODE, "", off=0, n_tokens=k * b, n_prompt=0, ms=(time.perf_counter() - t0) * 1e3, _steps=k)
        core._snapshots()
        self.n_bulk += 1
        self.n_steps += k
        return k, clocks[k - 1]
