"""`SimMemory`: the paper memory (slotlab/memory/paper/) with what a simulation needs on top.

* **Scripted generations**: `scripts[task_id]` = the token ids a request generated when it was
  recorded (a golden trace's answer, a trace that carries its outputs); the sampler returns them in
  order and falls back to the paper memory's placeholders (ids that match no prompt token) after
  the script, or for a request without one. Which request a sampler serves is looked up in the
  core's slots (`bind(core)`), since the memory interface's `sampler()` is not told (yet: the
  protocol's `task_id` will tell it once the paper memory takes it).
* **Decode accounting** for a simulated clock: `decoded` collects the token count of every
  successful target decode, `decoded_out` its count of output rows (logits requested); the
  simulator reads and clears both after each engine step (and `decoded_ctx` / `decoded_kv`, the
  positions the rows' / the sequences' contexts held, when `count_ctx` is set). `copied` adds up
  the bytes of sequence state got or set (checkpoints, RAM-cache saves and loads), which the
  simulator charges to the clock and zeroes.

Nothing else differs from `PaperMemory`: every decision the core takes on it is the one it takes
on a `PaperMemory`."""

from __future__ import annotations

from typing import Any

import numpy as np

from slotlab.memory.paper import PaperMemory

__all__ = ["ScriptSampler", "SimMemory"]


class ScriptSampler:
    """The sampler of a `SimMemory` with scripts: the request's script, then `base` (the paper
    memory's placeholders)."""

    last_probs = None  # a script carries no probabilities

    def __init__(self, mem: "SimMemory", base):
        self.mem, self.base = mem, base
        self._script: Any = False  # False = not looked up yet; None = no script
        self._slot = None

    def _lookup(self):
        core = self.mem.core
        if core is not None:
            for s in core.slots:
                if s.sampler is self and s.task is not None:
                    return self.mem.scripts.get(s.task.id), s
        return None, None

    @property
    def resolved(self) -> bool:
        """Whether the request was looked up (its first `sample` or `script` call)."""
        return self._script is not False

    def script(self) -> tuple[np.ndarray | None, int]:
        """The request's script (None: none) and how many tokens its slot has generated so far."""
        if self._script is False:
            self._script, self._slot = self._lookup()
        return self._script, (len(self._slot.generated) if self._slot is not None else 0)

    def sample(self, i: int) -> int:
        sc, k = self.script()
        if sc is not None:
            if k < len(sc):
                self.mem.base_sample(i)  # the same checks (logits requested for row i)
                return int(sc[k])
        return self.base.sample(i)

    def close(self) -> None:
        self.base.close()


class SimMemory(PaperMemory):
    """A `PaperMemory` with scripted generations and decode accounting (module docstring)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.core = None
        self.scripts: dict[int, np.ndarray] = {}
        self.decoded: list[int] = []
        self.decoded_out: list[int] = []
        self.copied = 0
        self.count_ctx = False  # also collect `decoded_ctx` (a speed model with an attention term)
        self.decoded_ctx: list[int] = []
        self.decoded_kv: list[int] = []

    def bind(self, core) -> "SimMemory":
        """The core whose slots tell which task a sampler serves (Engine(...).core)."""
        self.core = core
        return self

    def base_sample(self, i: int) -> int:
        self.last_row(i)  # the checks of a sample (logits requested for row i)
        return 0

    def sampler(self, *, temperature: float, seed: int, ignore_eos: bool, sampling=None, prompt=None):
        """The paper memory's placeholders (or the script): the request's sampler settings change no
        token on paper, so `sampling` and `prompt` are taken and not read."""
        base = super().sampler(temperature=temperature, seed=seed, ignore_eos=ignore_eos, sampling=sampling,
                               prompt=prompt)
        return ScriptSampler(self, base) if self.scripts else base

    def state_get(self, seq: int, **kw):
        out = super().state_get(seq, **kw)
        self.copied += len(out)
        return out

    def state_set(self, data, seq: int, **kw) -> int:
        n = super().state_set(data, seq, **kw)
        self.copied += n
        return n

    def decode(self, batch, off: int, n: int) -> int:
        ret = super().decode(batch, off, n)
        if ret == 0:
            self.decoded.append(n)
            self.decoded_out.append(int(np.count_nonzero(batch.logits[off:off + n])))
            if self.count_ctx:  # the positions each row's / each sequence's sequence held before the decode
                seq, pos = batch.seq[off:off + n], batch.pos[off:off + n]
                c = np.bincount(seq)
                own = int((c * (c - 1) // 2).sum())  # a run's positions among its own rows
                rows = int(pos.sum(dtype=np.int64)) - own
                self.decoded_ctx.append(rows)
                first = np.bincount(seq, weights=pos) - c * (c - 1) / 2  # c_s times the run's first position
                nz = c > 0
                self.decoded_kv.append(int(round(float((first[nz] / c[nz]).sum()))))
        return ret
