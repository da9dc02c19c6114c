"""How long a server step takes: the cost of each decode, from its token and output counts.

One decode of n tokens runs as ceil(n / n_ubatch) micro-batches. A micro-batch of m tokens with one
output (logits row) costs `t_fixed + m t_token` (the line `from_rates` builds), or, when the model was
calibrated, the measured cost of m tokens interpolated in `table`: on a CPU the cost is far from a
line at small m (one token costs what ~10 do in a long prefill), and generation lives there. Each
output row after the first adds `t_output` (the output projection over the vocabulary, a big share
of a small model's decode, and the sampling of that row), a decode with none (a prompt chunk) saves
`t_first_output`; each decode adds `t_decode` (what the engine's step does besides `llama_decode`:
building the batch, sampling, bookkeeping). Generation
with B sequences is one decode of B tokens with B outputs: B / decode_time(B, B) tokens/s in total,
which is what makes batching pay. Each byte of sequence state copied (a context checkpoint made or
restored, a prompt saved to or loaded from the RAM cache) costs `t_byte` (`copy_time`): a Gemma 3
270M checkpoint of 760 tokens is 7.9 MB, ~5 ms on a 2-vCPU machine.

`calibrate()` (`slotlab calibrate`) measures all of it on the real model on this machine, through
slotlab's own `Engine` (`measure`, then `fit`): a calibration workload (prompts of 1..512 tokens, a
conversation 2k tokens deep, 1-4 sequences generating) runs in step mode while every step, every
`llama_decode` and every state copy is timed, so the model sees the code path, batches, sampling and
threads the engine runs a trace with (an earlier calibration timed a separate context of its own:
on a quiet machine its decodes were ~20 % slower than the engine's own steps). `fit` puts the
model's form through those timings: the table at every micro-batch size the engine decoded, what a
decode with no output row saves (`t_first_output`: a prompt chunk, e.g. the server's cut 4 tokens
before a prompt's end for a checkpoint; on a 262k-token vocabulary the output row is a big share of
a small decode), `outputs`, `t_decode` (the step around `llama_decode`), `t_byte`, and the attention
terms. Attention makes a decode cost more the more positions its sequences already hold: `t_kv` per
such position and sequence in the decode (reading the sequence's K and V once: what makes a
generation step deep in a conversation slower), and `t_ctx` per token per such position (the products
of each token's query with them: what makes a prompt chunk deep in a context slower). Both are
lines, where a sliding window really saturates. `SpeedModel.from_rates(prefill_tps,
gen_tps)` builds one from the two numbers a GPU's spec sheet or a benchmark gives."""

from __future__ import annotations

import bisect
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SpeedModel", "calibrate", "fit", "measure"]


@dataclass(frozen=True)
class SpeedModel:
    t_fixed: float  # seconds per micro-batch
    t_token: float  # seconds per token
    n_ubatch: int = 512
    source: str = ""
    t_output: float = 0.0  # seconds per output row after the first
    t_decode: float = 0.0  # seconds per decode call (the engine's step around llama_decode)
    table: tuple = ()  # ((m, seconds), ...): measured micro-batches of m tokens, one output; m ascending
    outputs: tuple = ()  # ((k, seconds), ...): measured extra cost of k output rows over one; k ascending
    t_byte: float = 0.0  # seconds per byte of sequence state copied (checkpoints, RAM-cache saves and loads)
    t_ctx: float = 0.0  # seconds per token per position already in its sequence's context (attention)
    t_kv: float = 0.0  # seconds per position already held by each sequence in a decode (reading its KV)
    t_first_output: float = 0.0  # seconds a decode without any output row saves (the table has one)

    def __post_init__(self):
        object.__setattr__(self, "table", tuple(tuple(p) for p in self.table))
        object.__setattr__(self, "outputs", tuple(tuple(p) for p in self.outputs))
        object.__setattr__(self, "_tn", [p[0] for p in self.table])

    @classmethod
    def from_rates(cls, prefill_tps: float, gen_tps: float, n_ubatch: int = 512, source: str = "") -> "SpeedModel":
        """`prefill_tps`: prompt tokens/s of a long prefill; `gen_tps`: tokens/s of one sequence generating."""
        if prefill_tps <= 0 or gen_tps <= 0:
            raise ValueError("prefill and generation rates must be > 0")
        # a full micro-batch prefills at prefill_tps, one token decodes at gen_tps
        t_token = max(1e-12, (n_ubatch / prefill_tps - 1.0 / gen_tps) / max(1, n_ubatch - 1))
        t_fixed = max(0.0, 1.0 / gen_tps - t_token)
        return cls(t_fixed, t_token, n_ubatch, source or f"prefill {prefill_tps:g} tok/s, generation {gen_tps:g} tok/s")

    def ubatch_time(self, m: int) -> float:
        """One micro-batch of m tokens with one output: the table, interpolated (beyond its last point,
        extended by its last slope), else the line."""
        tb = self.table
        if not tb:
            return self.t_fixed + m * self.t_token
        j = bisect.bisect_left(self._tn, m)
        if j < len(tb) and tb[j][0] == m:
            return tb[j][1]
        if j == 0:
            (n1, t1), (n2, t2) = tb[0], tb[min(1, len(tb) - 1)]
        elif j == len(tb):
            (n1, t1), (n2, t2) = tb[max(0, j - 2)], tb[j - 1]
        else:
            (n1, t1), (n2, t2) = tb[j - 1], tb[j]
        if n2 == n1:
            return t1
        return max(0.0, t1 + (t2 - t1) * (m - n1) / (n2 - n1))

    def decode_time(self, n_tokens: int, n_outputs: int = 1, n_ctx: int = 0, n_kv: int = 0) -> float:
        """One decode of `n_tokens` tokens of which `n_outputs` have logits (a prompt chunk: 0 or 1;
        B sequences generating: B). `n_ctx`: the positions each row's sequence already held before
        this decode, summed over the rows (a chunk of c tokens after p: c p; a generating row at p: p);
        `n_kv`: the same summed over the sequences (a chunk after p: p)."""
        if n_tokens <= 0:
            return 0.0
        full, rest = divmod(n_tokens, self.n_ubatch)
        t = full * self.ubatch_time(self.n_ubatch) + (self.ubatch_time(rest) if rest else 0.0)
        if n_outputs > 1:
            t += self.output_time(n_outputs)
        elif n_outputs == 0:
            t -= self.t_first_output
        return t + self.t_decode + n_ctx * self.t_ctx + n_kv * self.t_kv

    def step_clocks(self, now: float, b: int, x0: int, n: int, ctx: bool):
        """The clock after each of `n` steps in which the same `b` sequences generate, from `now`:
        step j is `decode_time(b, b, x, x)` with x = x0 + j b (each row one position deeper a step;
        `ctx` False: `decode_time(b, b)` every step). A numpy array equal, bit for bit, to adding the
        steps one by one (`c += decode_time(...)`): the same float64 operations in the same order
        (`decode_time`'s ((t + t_decode) + x t_ctx) + x t_kv, then a sequential cumulative sum), so a
        fast-forward's clock, and every arrival it is compared with, is the plain stepping's; one
        numpy pass instead of a Python call per generated token."""
        import numpy as np

        base = self.decode_time(b, b)  # its n_ctx / n_kv terms are + 0.0: the same float
        acc = np.empty(n + 1)
        acc[0] = now
        if ctx:
            x = np.arange(n, dtype=np.float64) * b + x0
            acc[1:] = base + x * self.t_ctx
            acc[1:] += x * self.t_kv
        else:
            acc[1:] = base
        return np.add.accumulate(acc)[1:]

    def copy_time(self, n_bytes: int) -> float:
        """Copying `n_bytes` of sequence state (a checkpoint, a RAM-cache save or load)."""
        return n_bytes * self.t_byte

    def output_time(self, k: int) -> float:
        """What k output rows add over one: the measured `outputs`, interpolated (extended by the
        last slope), else (k - 1) t_output."""
        pts = ((1, 0.0), *self.outputs)
        if len(pts) == 1:
            return (k - 1) * self.t_output
        for (k1, t1), (k2, t2) in zip(pts, pts[1:]):
            if k <= k2:
                break
        return max(0.0, t1 + (t2 - t1) * (k - k1) / (k2 - k1))

    def gen_rate(self, batch: int = 1) -> float:
        """Tokens/s per sequence when `batch` sequences generate together."""
        return 1.0 / self.decode_time(batch, batch)

    def prefill_rate(self, n: int = 2048) -> float:
        return n / self.decode_time(n)

    def to_json(self, path=None) -> str:
        text = json.dumps(asdict(self), indent=1)
        if path:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, src) -> "SpeedModel":
        s = str(src)
        d = json.loads(s if s.lstrip().startswith("{") else Path(src).read_text())
        return cls(**d)


SIZES = (*range(1, 17), 20, 24, 28, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def measure(model=None, *, sizes=SIZES, seqs=(2, 3, 4),
            depths=(1024, 2048), repeats: int = 5, n_threads: int | None = None, n_gpu_layers: int = 0,
            flags=None, seed: int = 0) -> dict:
    """Run a calibration workload through slotlab's `Engine` on the real model (`model`: a loaded
    `slotlab.llama.Model`, a GGUF path, or None for the embedded model) and record every step: the
    same decode path, batches, sampling and state copies the engine makes on a trace. The engine runs
    the server's defaults with `-c 4096` (plus `flags`: llama-server flags, e.g. `--swa-full`), step
    mode, greedy, one warm-up request of each kind first (not recorded):

    * prompts of each length in `sizes` at position 0, `repeats` each, one at a time, two tokens
      generated (on a model whose prompts the server cuts for a checkpoint, 4 tokens more: the prompt
      decode is then exactly the size);
    * a conversation that grows in one slot to each depth in `depths`, then `repeats` turns of 1 and
      32 new tokens after it (attention deep in a context), two tokens generated each;
    * 1 and each of `seqs` sequences generating at once (short prompts): the batched steps.

    Returns {"steps": [...], "table", "seqs", "step", "copy"}: each step as [wall seconds, state bytes
    copied, seconds copying, [[n_tokens, n_outputs, n_ctx, n_kv, seconds, n_seqs], ...] per `llama_decode`]
    (`n_ctx` / `n_kv` as `SpeedModel.decode_time` takes them); and summaries for the eye: "table" [m,
    median seconds of a decode of m tokens of one sequence at position 0], "seqs" / "step" [B, median
    seconds of an engine step in which B sequences generate], "copy" [bytes, seconds]."""
    import numpy as np

    from slotlab.engine.scheduler import Engine
    from slotlab.llama import Model

    own = not isinstance(model, Model)
    m = Model(model, n_gpu_layers=n_gpu_layers) if own else model
    args = ["-c", "4096", "--no-repack", *(["-t", str(n_threads)] if n_threads else []), *(flags or [])]
    eng = Engine(args, model=m)
    rec = _Recorder(eng)
    rng = np.random.default_rng(seed)
    core = eng.core
    ck = getattr(core, "checkpoints", None)
    tail = min(ck.offsets) if ck is not None and ck.enabled else 0  # the server's cut before a prompt's end
    n_vocab = min(m.n_vocab, 32000)
    uniq = iter(range(1000, 10 ** 9))

    def prompt(n: int) -> list[int]:  # a first token no earlier prompt had: nothing is reused by chance
        return [next(uniq) % n_vocab, *rng.integers(10, n_vocab, n - 1).tolist()]

    def run(prompts, n_predict=2, **kw):
        tasks = [eng.submit(p, n_predict=n_predict, ignore_eos=True, temperature=0.0, **kw) for p in prompts]
        eng.run_until(lambda: all(t.done for t in tasks))
        if any(t.error is not None for t in tasks):
            raise RuntimeError(f"calibration request failed: {next(t.error for t in tasks if t.error)}")
        return tasks

    n_gen = 4 + 4 * repeats
    try:
        # warm-up, not recorded: the new context's first decodes of each shape
        for n in (max(sizes), 32, 1):
            run([prompt(n + tail)])
        run([prompt(32 + tail) for _ in range(max(seqs, default=1))], n_predict=4)
        rec.on = True
        for _ in range(repeats):
            for n in sizes:
                run([prompt(n + tail)])
        for depth in depths:  # a conversation in slot 0: the context grows, each turn appended
            conv = prompt(depth)
            run([conv], id_slot=0)
            for _ in range(repeats):
                for n in (1, 32):
                    conv = conv + rng.integers(10, n_vocab, n + tail).tolist()
                    run([conv], id_slot=0)
        for b in (1, *seqs):
            run([prompt(32 + tail) for _ in range(b)], n_predict=n_gen)
    finally:
        rec.on = False
        eng.close()
        if own:
            m.close()
    steps = rec.steps
    out: dict = {"steps": steps}
    table = {}
    for _, _, _, decs in steps:
        if len(decs) == 1 and decs[0][2] == 0 and decs[0][5] == 1:
            table.setdefault(decs[0][0], []).append(decs[0][4])
    out["table"] = [[n, statistics.median(table[n])] for n in sorted(table)]
    gen = {}
    for wall, nb, _, decs in steps:  # B sequences generating: one decode of B tokens, B outputs
        if len(decs) == 1 and decs[0][0] == decs[0][1] and not nb:
            gen.setdefault(decs[0][0], []).append(wall)
    out["seqs"] = [[b, statistics.median(gen[b])] for b in seqs if b in gen]
    out["step"] = [len(gen.get(1, ())), statistics.median(gen[1])] if gen.get(1) else None
    cp = [(nb, s) for _, nb, s, _ in steps if nb]
    out["copy"] = [sum(c[0] for c in cp), sum(c[1] for c in cp)] if cp else None
    return out


class _Recorder:
    """Times an engine's steps, its `llama_decode` calls and its state copies (wrapping the core's
    `step` and the memory's `decode` / `state_get` / `state_set` on the instances)."""

    def __init__(self, eng):
        import numpy as np

        self.on = False
        self.steps: list = []
        self._cur = None
        core, mem = eng.core, eng.memory
        step, decode, get, put = core.step, mem.decode, mem.state_get, mem.state_set

        def step_():
            if not self.on:
                return step()
            self._cur = cur = [0, 0.0, []]
            t0 = time.perf_counter()
            try:
                return step()
            finally:
                wall = time.perf_counter() - t0
                self._cur = None
                if cur[2]:
                    self.steps.append([wall, cur[0], cur[1], cur[2]])

        def decode_(batch, off, n):
            t0 = time.perf_counter()
            ret = decode(batch, off, n)
            dt = time.perf_counter() - t0
            if ret == 0 and self._cur is not None:
                seq, pos = batch.seq[off:off + n], batch.pos[off:off + n]
                self._cur[2].append([int(n), int(np.count_nonzero(batch.logits[off:off + n])),
                                     *context_positions(seq, pos), dt, len(np.unique(seq))])
            return ret

        def get_(*a, **kw):
            t0 = time.perf_counter()
            out = get(*a, **kw)
            self._copied(len(out), time.perf_counter() - t0)
            return out

        def put_(data, *a, **kw):
            t0 = time.perf_counter()
            n = put(data, *a, **kw)
            self._copied(n, time.perf_counter() - t0)
            return n

        core.step, mem.decode, mem.state_get, mem.state_set = step_, decode_, get_, put_

    def _copied(self, n: int, dt: float) -> None:
        if self._cur is not None:
            self._cur[0] += int(n)
            self._cur[1] += dt


def context_positions(seq, pos) -> tuple[int, int]:
    """(n_ctx, n_kv) of a decode's rows (`SpeedModel.decode_time`): the positions each row's sequence
    held before the decode, summed over the rows, and the same once per sequence (each sequence's rows
    are one run of consecutive positions, as the server's batches are)."""
    import numpy as np

    seq = np.asarray(seq)
    pos = np.asarray(pos, dtype=np.int64)
    c = np.bincount(seq)
    own = int((c * (c - 1) // 2).sum())
    first = np.bincount(seq, weights=pos) - c * (c - 1) / 2
    nz = c > 0
    return int(pos.sum()) - own, int(round(float((first[nz] / c[nz]).sum())))


def pool(measurements: list[dict]) -> dict:
    """Several `measure` results as one: their steps together (the fit's outlier rejection and
    least squares then treat every run alike); the summaries are the first run's."""
    out = dict(measurements[0])
    out["steps"] = [s for m in measurements for s in m["steps"]]
    return out


def fit(meas: dict, n_ubatch: int = 512, source: str = "") -> SpeedModel:
    """The speed model of the steps `measure` recorded, in three parts:

    * the engine's work around `llama_decode` in a step (the step less its decodes: batch building,
      sampling, bookkeeping, state copies), least squares (robust, as below) of a + b k + t_byte B,
      k the step's output rows, B the bytes of state it got or set: at one output row a + b is
      `t_decode`; each further row adds b to `outputs` and a decode without outputs (a prompt chunk)
      saves it, in `t_first_output`; `t_byte` is then what the engine pays per byte copied, the
      buffers it allocates and copies around `llama_state_seq_get` / `set` included;
    * each `llama_decode`'s seconds, least squares of the model's own form relative to the measured
      time (outliers beyond 3 median deviations dropped, twice): the table's seconds at every
      micro-batch size the engine decoded (interpolated in between; a decode past `n_ubatch` is its
      micro-batches), what no output row saves, what k rows add over one, `t_ctx` and `t_kv`, all
      >= 0. `t_fixed` / `t_token` are the table's least-squares line (for a table-less copy)."""
    import numpy as np

    steps = meas["steps"]
    # the step around llama_decode: wall - decodes = a + b k + t_byte bytes (k: the step's output rows)
    rows = [(1.0, float(sum(d[1] for d in ds)), float(nb), wall - sum(d[4] for d in ds)) for wall, nb, _, ds in steps
            if ds]
    a0 = a1 = t_byte = 0.0
    if rows:
        x = np.array([r[:3] for r in rows])
        y = np.array([r[3] for r in rows])
        a0, a1, t_byte = (float(v) for v in _robust(x, y))
    decs = [d for _, _, _, ds in steps for d in ds]
    pieces = []
    for n, *_ in decs:  # a decode past n_ubatch runs as micro-batches
        full, rest = divmod(n, n_ubatch)
        pieces.append([(n_ubatch, full)] + ([(rest, 1)] if rest else []))
    knots = sorted({m for ps in pieces for m, c in ps if c})
    kix = {m: j for j, m in enumerate(knots)}
    multi = sorted({d[1] for d in decs if d[1] > 1})
    has0 = any(d[1] == 0 for d in decs)
    nk = len(knots)
    cols = nk + len(multi) + 3  # knots, k outputs (k > 1), no output (a saving), t_ctx, t_kv
    x = np.zeros((len(decs), cols))
    y = np.array([d[4] for d in decs], float)

    def hat(m: int) -> list[tuple[int, float]]:
        j = bisect.bisect_left(knots, m)
        if j < nk and knots[j] == m:
            return [(j, 1.0)]
        lo, hi = (j - 1, j) if 0 < j < nk else ((0, 1) if j == 0 else (nk - 2, nk - 1))
        if nk == 1:
            return [(0, m / knots[0])]
        f = (m - knots[lo]) / (knots[hi] - knots[lo])
        return [(lo, 1.0 - f), (hi, f)]

    for i, ((n, k, c, v, *_), ps) in enumerate(zip(decs, pieces)):
        for m, cnt in ps:
            if cnt:
                for j, f in hat(m):
                    x[i, j] += cnt * f
        if k > 1:
            x[i, nk + multi.index(k)] = 1.0
        elif k == 0:
            x[i, nk + len(multi)] = -1.0
        x[i, -2], x[i, -1] = c, v
    coef = _robust(x, y)
    tb = tuple((m, float(coef[kix[m]])) for m in knots)
    outs = tuple((k, float(coef[nk + j]) + a1 * (k - 1)) for j, k in enumerate(multi))
    t_first = (float(coef[nk + len(multi)]) if has0 else 0.0) + (a1 if has0 else 0.0)
    t_ctx, t_kv = float(coef[-2]), float(coef[-1])
    xs = np.array([p[0] for p in tb], float)
    ys = np.array([p[1] for p in tb], float)
    if len(tb) > 1:
        (t_fixed, t_token), *_ = np.linalg.lstsq(np.vstack([np.ones_like(xs), xs]).T, ys, rcond=None)
    else:
        t_fixed, t_token = (float(ys[0]) if len(ys) else 0.0), 0.0
    t_out = outs[-1][1] / (outs[-1][0] - 1) if outs else a1
    return SpeedModel(max(float(t_fixed), 0.0), max(float(t_token), 1e-12), n_ubatch, source or "calibrated", t_out,
                      a0 + a1, tb, outs, t_byte, t_ctx, t_kv, t_first)


def _robust(x, y):
    """Least squares of `x c = y` with c >= 0, relative to y, refitted twice without the rows beyond 3
    median deviations (at least 5 %) from the median residual: the steps a busy machine slowed do not
    pull the fit. Columns all zero get 0."""
    import numpy as np

    w = 1.0 / np.maximum(np.abs(y), 1e-12)
    use = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    keep = np.ones(len(y), bool)
    coef = np.zeros(x.shape[1])
    for _ in range(3):
        sub = _nnls(x[keep][:, use] * w[keep, None], y[keep] * w[keep])
        coef[:] = 0.0
        coef[use] = sub
        r = (x @ coef - y) * w
        mad = 1.4826 * float(np.median(np.abs(r[keep] - np.median(r[keep]))))
        nxt = np.abs(r - np.median(r[keep])) <= max(3 * mad, 0.05)
        if (nxt == keep).all():
            break
        keep = nxt
    return coef


def _nnls(a, b, iters: int = 100):
    """min |a x - b| with x >= 0: least squares, then the most negative coefficient pinned to 0 and the
    rest solved again, until none is negative (an active-set sketch; enough for a dozen columns)."""
    import numpy as np

    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    for _ in range(iters):
        if not free:
            break
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0.0
            x[free] = sol
            break
        free.pop(int(np.argmin(sol)))
    return x


def calibrate(model_path=None, *, repeats: int = 5, n_threads: int | None = None,
              n_gpu_layers: int = 0, flags=None) -> tuple[SpeedModel, dict]:
    """`measure` the model through slotlab's engine and `fit` the speed model to it. `model_path`: a
    GGUF path, a loaded `slotlab.llama.Model`, or None (the embedded model); `flags`: more llama-server
    flags for the calibration engine. Returns the model and the measurements."""
    from slotlab.llama import Model

    meas = measure(model_path, repeats=repeats, n_threads=n_threads, n_gpu_layers=n_gpu_layers, flags=flags)
    name = Path(model_path.path if isinstance(model_path, Model) else (model_path or "the embedded model")).name
    return fit(meas, 512, f"calibrated on {name} through slotlab's engine"), meas
