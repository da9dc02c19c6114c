"""How long a server step takes: the cost of each decode, from its token and output counts.

One decode of n tokens runs as ceil(n / n_ubatch) micro-batches. A micro-batch of m tokens with one
output (logits row) costs `t_fixed + m t_token` (the line `from_rates` builds), or, when the model was
calibrated, the measured cost of m tokens interpolated in `table`: on a CPU the cost is far from a
line at small m (one token costs what ~10 do in a long prefill), and generation lives there. Each
output row after the first adds `t_output` (the output projection over the vocabulary, a big share
of a small model's decode, and the sampling of that row); each decode adds `t_decode` (what the
engine's step does besides `llama_decode`: building the batch, sampling, bookkeeping). Generation
with B sequences is one decode of B tokens with B outputs: B / decode_time(B, B) tokens/s in total,
which is what makes batching pay. Each byte of sequence state copied (a context checkpoint made or
restored, a prompt saved to or loaded from the RAM cache) costs `t_byte` (`copy_time`): a Gemma 3
270M checkpoint of 760 tokens is 7.9 MB, ~5 ms on a 2-vCPU machine.

`calibrate()` (`slotlab calibrate`) measures all of it on the real model on this machine (`measure`,
then `fit`): the table, single-micro-batch decodes of 1..512 tokens; `outputs` from decodes of B
sequences at once and slotlab's engine generating two; `t_decode` from the engine generating one;
`t_byte` from state copies; `t_ctx` and `t_kv` from decodes deep in a context. Attention makes a
decode cost more the more positions its sequences already hold: `t_kv` per such position and
sequence in the decode (reading the sequence's K and V once: what makes a generation step deep in a
conversation slower), and `t_ctx` per token per such position (the products of each token's query
with them: what makes a prompt chunk deep in a context slower). Both are lines, where a sliding
window really saturates. `SpeedModel.from_rates(prefill_tps,
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
        return t + self.t_decode + n_ctx * self.t_ctx + n_kv * self.t_kv

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


def measure(model=None, *, sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512), seqs=(2, 3, 4),
            repeats: int = 5, n_threads: int | None = None, n_gpu_layers: int = 0, engine: bool = True) -> dict:
    """Time the real model on this machine (`model`: a loaded `slotlab.llama.Model`, a GGUF path, or
    None for the embedded model), each figure the median of `repeats` after a warm-up:

    * "table": [m, seconds] for a decode of m tokens of one sequence with one output, m in `sizes`;
    * "seqs": [B, seconds] for a decode of one token in each of B sequences, B outputs (generation);
    * "deep": [m, p, seconds] for m tokens decoded after p positions of the sequence;
    * "copy": [bytes, seconds] - getting (and copying, as a checkpoint does) and setting back the
      state of a sequence of 512 tokens, per byte: the mean of the two;
    * "step": [n, seconds] and "step2": [n, seconds] - slotlab's engine (`-np 4`, greedy) generating
      one sequence, and two at once: n steps and the median seconds a step takes,
      `llama_decode` included (skipped with `engine=False`)."""
    import numpy as np

    from slotlab.llama import Batch, Context, Model

    own = not isinstance(model, Model)
    m = Model(model, n_gpu_layers=n_gpu_layers) if own else model
    n_ub = max(sizes)
    n_seq = max(seqs, default=1)
    kw = dict(n_ctx=4096, n_batch=n_ub, n_ubatch=n_ub, n_parallel=n_seq, kv_unified=True)
    if n_threads:
        kw.update(n_threads=n_threads, n_threads_batch=n_threads)
    ctx = Context(m, **kw)
    b = Batch(n_ub)
    rng = np.random.default_rng(0)

    def timed(build) -> float:
        ts = []
        for _ in range(repeats):
            build()
            t0 = time.perf_counter()
            if ctx.decode(b) != 0:
                raise RuntimeError("calibration decode failed")
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def one_seq(n):
        def build():
            ctx.seq_rm(0, 0, -1)
            b.clear()
            b.add_seq(rng.integers(10, 1000, n).astype(np.int32), 0, 0, logits_last=True)
        return build

    def many_seqs(k, pos=64):
        def build():
            b.clear()
            for q in range(k):
                ctx.seq_rm(q, pos, -1)
                b.add(int(rng.integers(10, 1000)), pos, q, logits=True)
        return build

    out: dict = {}
    try:
        timed(one_seq(sizes[0]))  # warm-up
        out["table"] = [[n, timed(one_seq(n))] for n in sizes]
        for q in range(n_seq):  # a 64-token history in every sequence
            ctx.seq_rm(q, 0, -1)
            b.clear()
            b.add_seq(rng.integers(10, 1000, 64).astype(np.int32), 0, q)
            if ctx.decode(b) != 0:
                raise RuntimeError("calibration decode failed")
        out["seqs"] = [[k, timed(many_seqs(k))] for k in seqs]
        ctx.seq_rm(0, 0, -1)
        b.clear()
        b.add_seq(rng.integers(10, 1000, n_ub).astype(np.int32), 0, 0)
        if ctx.decode(b) != 0:
            raise RuntimeError("calibration decode failed")
        tg, ts = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            blob = ctx.state_seq_get(0).copy()
            t1 = time.perf_counter()
            ctx.state_seq_set(blob, 0)
            tg.append(t1 - t0)
            ts.append(time.perf_counter() - t1)
        out["copy"] = [len(blob), (statistics.median(tg) + statistics.median(ts)) / 2]

        def deep(m_, p):
            q = 0 if p else 1  # p = 0 on another sequence: sequence 0 keeps its history
            def build():
                ctx.seq_rm(q, p, -1)
                b.clear()
                b.add_seq(rng.integers(10, 1000, m_).astype(np.int32), p, q, logits_last=True)
            return build

        ctx.seq_rm(0, 0, -1)  # a 3072-token history, then decodes of m tokens after p of it
        for p0 in range(0, 3072, n_ub):
            b.clear()
            b.add_seq(rng.integers(10, 1000, n_ub).astype(np.int32), p0, 0)
            if ctx.decode(b) != 0:
                raise RuntimeError("calibration decode failed")
        # deepest first: each cut keeps the positions below p
        out["deep"] = [[m_, p, timed(deep(m_, p))] for p in (3000, 2048, 1024, 0) for m_ in (1, 32)]
    finally:
        ctx.close()
    if engine:
        out["step"] = _engine_step(m, n_threads, 1)
        out["step2"] = _engine_step(m, n_threads, 2)
    if own:
        m.close()
    return out


def _engine_step(model, n_threads: int | None, n_seq: int, n_gen: int = 33) -> list:
    """slotlab's engine generating `n_gen` tokens in each of `n_seq` sequences at once (short prompts):
    [steps, median seconds of a step in which all of them generate]."""
    from slotlab.engine.scheduler import Engine

    # 4 slots (the server's default), n_seq of them generating: the engine's step walks every slot
    flags = ["-np", "4", "-kvu", "-c", "4096", "--no-repack"] + (["-t", str(n_threads)] if n_threads else [])
    eng = Engine(flags, model=model)
    stamps: dict[int, list[float]] = {}
    try:
        tasks = [eng.submit(f"Calibration {q}: count from one to fifty, in words, separated by commas.",
                            n_predict=n_gen, ignore_eos=True,
                            on_token=lambda task, tok: stamps.setdefault(task.id, []).append(time.perf_counter()))
                 for q in range(n_seq)]
        eng.run_until(lambda: all(t.done for t in tasks))
    finally:
        eng.close()
    if any(t.error is not None for t in tasks) or len(stamps) != n_seq:
        raise RuntimeError("calibration generation failed")
    runs = [stamps[t.id] for t in tasks]
    start = max(r[1] for r in runs)  # from the first step in which every sequence generates
    end = min(r[-1] for r in runs)
    ts = [x for x in runs[0] if start <= x <= end]  # one stamp a step: the first sequence's tokens
    steps = [b - a for a, b in zip(ts, ts[1:])]
    if len(steps) < 3:
        raise RuntimeError("calibration generation too short")
    return [len(steps), statistics.median(steps)]


def pool(measurements: list[dict]) -> dict:
    """The median of several `measure` results, figure by figure (they must share their sizes)."""
    first = measurements[0]
    out = {}
    for key in first:
        if key in ("step", "step2", "copy"):
            out[key] = [first[key][0], statistics.median(m[key][1] for m in measurements)]
        else:
            out[key] = [[*p[:-1], statistics.median(m[key][j][-1] for m in measurements)] for j, p in enumerate(first[key])]
    return out


def fit(meas: dict, n_ubatch: int = 512, source: str = "") -> SpeedModel:
    """The speed model of `measure`'s figures: the table as measured; its least-squares line as
    t_fixed / t_token (for a table-less copy); `t_decode` = the engine's one-sequence generation step
    less a one-token decode; `outputs` = B sequences' decode less B tokens of one, plus what each
    scaled so that two sequences cost what the engine's two-sequence step does; `t_byte` = the state copy's seconds per byte; `t_kv` and `t_ctx` = the plane through the extra cost
of decodes of 1 and 32 tokens deep in a context."""
    import numpy as np

    tb = sorted((int(n), float(t)) for n, t in meas["table"])
    xs = np.array([p[0] for p in tb], float)
    ys = np.array([p[1] for p in tb], float)
    (t_fixed, t_token), *_ = np.linalg.lstsq(np.vstack([np.ones_like(xs), xs]).T, ys, rcond=None)
    sm = SpeedModel(max(float(t_fixed), 0.0), max(float(t_token), 1e-9), n_ubatch, source or "calibrated",
                    table=tuple(tb))
    seqs = {int(k): float(t) for k, t in meas.get("seqs", ())}
    t_dec = max(0.0, float(meas["step"][1]) - sm.ubatch_time(1)) if meas.get("step") else 0.0
    scale = 1.0  # the engine's two-sequence step decides the outputs' cost; the decodes, its growth with k
    if meas.get("step") and meas.get("step2") and seqs.get(2, 0) > sm.ubatch_time(2):
        eng2 = float(meas["step2"][1]) - float(meas["step"][1]) - (sm.ubatch_time(2) - sm.ubatch_time(1))
        scale = max(0.0, eng2) / (seqs[2] - sm.ubatch_time(2))
    outs = tuple((k, scale * max(0.0, t - sm.ubatch_time(k))) for k, t in sorted(seqs.items()))
    t_out = outs[-1][1] / (outs[-1][0] - 1) if outs else 0.0
    t_byte = float(meas["copy"][1]) / float(meas["copy"][0]) if meas.get("copy") else 0.0
    t_ctx = t_kv = 0.0
    if meas.get("deep"):  # least squares: t(m, p) - t(m, 0) = t_kv p + t_ctx m p
        base = {m_: t for m_, p, t in meas["deep"] if p == 0}
        rows = [(p, m_ * p, t - base[m_]) for m_, p, t in meas["deep"] if p]
        if len({m_ for m_, p, t in meas["deep"] if p}) > 1:
            a = np.array([[r[0], r[1]] for r in rows], float)
            (t_kv, t_ctx), *_ = np.linalg.lstsq(a, np.array([r[2] for r in rows], float), rcond=None)
            t_kv, t_ctx = max(0.0, float(t_kv)), max(0.0, float(t_ctx))
    return SpeedModel(sm.t_fixed, sm.t_token, n_ubatch, sm.source, t_out, t_dec, tuple(tb), outs, t_byte, t_ctx,
                      t_kv)


def calibrate(model_path=None, *, repeats: int = 5, n_threads: int | None = None,
              n_gpu_layers: int = 0) -> tuple[SpeedModel, dict]:
    """`measure` the model and `fit` the speed model to it. `model_path`: a GGUF path, a loaded
    `slotlab.llama.Model`, or None (the embedded model). Returns the model and the measurements."""
    from slotlab.llama import Model

    meas = measure(model_path, repeats=repeats, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    name = Path(model_path.path if isinstance(model_path, Model) else (model_path or "the embedded model")).name
    return fit(meas, 512, f"calibrated on {name}"), meas
