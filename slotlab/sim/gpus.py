"""How fast a model runs on a GPU class when no one has measured it: shipped speed models per profile
and GPU class, built from published llama.cpp measurements and spec sheets, each with its source.

Why this exists: a simulated day only means something in time (TTFT, queueing, how many servers keep
up) if a 27B model prefills slower than an 8B one and an H100 faster than an RTX 4090. A user who has
the server measures it (`slotlab calibrate --url`, exact for their box); everyone else gets these,
which say what they rest on.

The form is the one `SpeedModel` already has (a micro-batch of m tokens costs `table[m]`, attention
deep in a context adds `t_ctx` / `t_kv`), filled in from three measured things and one spec-sheet ratio:

* **Generation** (one token, one sequence) reads every active weight once: `t_gen = a + b x GB`, the
  line fitted per GPU class to `GEN_MEASURED`, llama.cpp's server generating one request with dense
  Q4_K_M models of 0.7-18.3 GB on 13 GPUs (Pavlo Khmel, 2026-06-07). An MoE reads only its active
  experts, slower per byte than a dense model (routing, small expert matmuls): its active bytes are
  scaled by `MOE_FACTOR`, fitted to the same table's three MoE models (the fit's residuals are in
  `fit_report()`; tests hold them).
* **Prefill** of a micro-batch of m tokens: the RTX 4090's measured curve for Llama 8B Q4_K_S
  (`PREFILL_ANCHOR`, llama.cpp PR #7860: 1,946 tok/s at m = 16 up to 9,279 at m = 512), less its
  weight read, is compute: scaled by the profile's active parameters over the anchor's and by the
  GPU's int8 tensor rate (llama.cpp's MMQ kernels run int8 `mma.sync`; Hopper's spec-sheet rate needs
  `wgmma`, so slotlab assumes half of it: `mma_sync_factor`) over the 4090's. An MoE's active
  parameters count `MOE_FACTOR` times here too (an assumption: no MoE prefill was measured).
* **Attention deep in a context**: a token at depth p costs 4 x n_head x head_dim FLOPs per full
  attention layer and position (Q K^T and the weighted V), at the same effective rate (`t_ctx`); a
  generating sequence reads its K and V once per step at the generation fit's bytes/s (`t_kv`). Sliding
  window layers are left out (their cost stops growing at the window).

The weights are `n_params x QUANT_BPW / 8` bytes (Q4_K_M, what users run; the measured table's files
are 4.7-5.0 bits a weight). Estimates, not measurements: the prefill of a GPU other than the RTX 4090
is a spec-sheet ratio, MoE prefill is assumed to cost its active parameters. `source` says so on every
model built here."""

from __future__ import annotations

from dataclasses import dataclass

from slotlab.memory.profile import Q4_K_M_BITS_PER_WEIGHT

__all__ = ["GPU", "GPUS", "gpu", "speed_for", "default_gpu", "fit_note", "weights_bytes", "fit_report", "UnknownGPU"]

QUANT_BPW = Q4_K_M_BITS_PER_WEIGHT  # the weights are sized as a Q4_K_M GGUF's

GEN_SOURCE = ("https://pavlokhmel.com/llm_throughput_benchmark_on_13_gpus_and_10_models.html (2026-06-07): "
              "llama.cpp, one request, unsloth Q4_K_M GGUFs")
# model: (file GB, active fraction (None: dense), tok/s per column of GEN_COLUMNS ('x': did not fit))
GEN_COLUMNS = ("a100-pcie-40g", "a100-sxm-80g", "rtx-4080", "rtx-4090", "h200-nvl", "h100-sxm", "h200-sxm")
GEN_MEASURED = {
    "LFM2.5-1.2B": (0.7, None, "485 524 614 741 737 764 796"),
    "Ministral-3-3B": (1.8, None, "184 211 210 271 308 305 312"),
    "Qwen3.5-4B": (2.7, None, "145 154 164 206 226 234 241"),
    "Qwen3.5-9B": (5.7, None, "113 123 105 137 184 190 197"),
    "Qwen3.6-27B": (16.8, None, "41 46 x 47 71 74 76"),
    "gemma-4-31B": (18.3, None, "37 43 x 35 65 68 71"),
    # MoE: active fraction from the model cards (gpt-oss-20b 3.6 B of 20.9 B; gemma-4-26B-A4B 3.8 B of
    # 25.2 B; Qwen3.6-35B-A3B 3 B of 35 B)
    "gpt-oss-20b": (11.6, 3.6 / 20.9, "180 189 210 266 276 286 292"),
    "gemma-4-26B-A4B": (16.9, 3.8 / 25.2, "108 116 x 149 178 181 188"),
    "Qwen3.6-35B-A3B": (22.1, 3.0 / 35.0, "120 128 x 180 189 194 204"),
}

PREFILL_SOURCE = ("https://github.com/ggml-org/llama.cpp/pull/7860 (RTX 4090, llama 8B Q4_K_S, llama-bench pp2048 "
                  "by micro-batch size)")
PREFILL_ANCHOR = {"gpu": "rtx-4090", "n_params_active": 8.03e9, "gb": 4.69,
                  "tps": ((16, 1946.01), (32, 3358.03), (64, 5349.26), (128, 6901.00), (256, 8555.10),
                          (512, 9278.55))}
HOPPER_SOURCE = ("Hopper's spec-sheet tensor rate needs wgmma, which llama.cpp's MMQ kernels (mma.sync) do not use "
                 "(Luo et al., 'Benchmarking and Dissecting the Nvidia Hopper GPU Architecture', arXiv 2402.13499); "
                 "slotlab assumes half")


@dataclass(frozen=True)
class GPU:
    name: str
    label: str
    memory_gib: float
    bandwidth_gbs: float  # spec sheet
    int8_tops: float  # dense int8 tensor TOPS, spec sheet
    source: str
    mma_sync_factor: float = 1.0  # the share of int8_tops llama.cpp's mma.sync kernels can reach

    @property
    def int8_rate(self) -> float:
        return self.int8_tops * self.mma_sync_factor


GPUS = {g.name: g for g in (
    GPU("rtx-4080", "RTX 4080 16 GB", 16, 717, 389.9, "NVIDIA Ada Lovelace architecture whitepaper v2.02, appendix A"),
    GPU("rtx-4090", "RTX 4090 24 GB", 24, 1008, 660.6, "NVIDIA Ada Lovelace architecture whitepaper v2.02, appendix A"),
    GPU("a100-pcie-40g", "A100 PCIe 40 GB", 40, 1555, 624, "NVIDIA A100 datasheet"),
    GPU("a100-sxm-80g", "A100 SXM 80 GB", 80, 2039, 624, "NVIDIA A100 datasheet"),
    GPU("h100-sxm", "H100 SXM 80 GB", 80, 3350, 1979, "NVIDIA H100 datasheet; " + HOPPER_SOURCE, 0.5),
    GPU("h200-nvl", "H200 NVL 141 GB", 141, 4800, 1671, "NVIDIA H200 datasheet; " + HOPPER_SOURCE, 0.5),
    GPU("h200-sxm", "H200 SXM 141 GB", 141, 4800, 1979, "NVIDIA H200 datasheet; " + HOPPER_SOURCE, 0.5),
)}


class UnknownGPU(ValueError):
    pass


def _lstsq_rel(rows):
    """Least squares of 1/tok/s = a + b x, relative to the measured time (each row weighs alike)."""
    import numpy as np

    x = np.array([[1.0, r[0]] for r in rows])
    y = np.array([r[1] for r in rows])
    w = 1.0 / y
    (a, b), *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return float(a), float(b)


def _gen_fits():
    """Per GPU class: (a seconds, b seconds per GB) of one generated token, from the dense rows; and the
    MoE factor on active bytes, fitted to the MoE rows of every class (least squares in log space)."""
    import math

    fits = {}
    for j, g in enumerate(GEN_COLUMNS):
        rows = [(gb, 1.0 / float(v.split()[j])) for gb, act, v in GEN_MEASURED.values()
                if act is None and v.split()[j] != "x"]
        fits[g] = _lstsq_rel(rows)
    logs = []
    for gb, act, v in GEN_MEASURED.values():
        if act is None:
            continue
        for j, g in enumerate(GEN_COLUMNS):
            if v.split()[j] != "x":
                a, b = fits[g]
                logs.append(math.log(max(1e-9, (1.0 / float(v.split()[j]) - a) / (b * gb * act))))
    return fits, math.exp(sum(logs) / len(logs))


GEN_FITS, MOE_FACTOR = _gen_fits()


def fit_report() -> list[dict]:
    """Every measured row against the fit: model, GPU, measured and predicted tok/s (what the tests hold)."""
    out = []
    for model, (gb, act, v) in GEN_MEASURED.items():
        for j, g in enumerate(GEN_COLUMNS):
            if v.split()[j] == "x":
                continue
            a, b = GEN_FITS[g]
            t = a + b * gb * (1.0 if act is None else act * MOE_FACTOR)
            out.append({"model": model, "gpu": g, "moe": act is not None, "measured": float(v.split()[j]),
                        "predicted": 1.0 / t})
    return out


def weights_bytes(profile) -> tuple[float, float]:
    """(all weights, the weights one token reads) in bytes at `QUANT_BPW`; an MoE's active bytes count
    `MOE_FACTOR` times (its slower reads). Raises ValueError for a profile without parameter counts."""
    n = float(profile.n_params or 0)
    if n <= 0:
        raise ValueError(f"profile {profile.name or profile.architecture} has no n_params: give --speed, "
                         "--prefill-tps / --gen-tps, or measure the server (slotlab calibrate --url)")
    act = float(profile.n_params_active or 0) or n
    total = n * QUANT_BPW / 8
    return total, act * QUANT_BPW / 8 * (MOE_FACTOR if act < n else 1.0)


def _holds(g: GPU, weights: float) -> bool:
    """One GPU of class `g` holds `weights` bytes with 10 % to spare (the KV cache and buffers need room too)."""
    return weights * 1.1 <= g.memory_gib * 2**30


def default_gpu(profile) -> GPU:
    """The smallest shipped GPU class that holds the weights (`_holds`), the fastest of those of one
    size; the largest if none does."""
    total, _ = weights_bytes(profile)
    fits = [g for g in GPUS.values() if _holds(g, total)]
    if not fits:
        return max(GPUS.values(), key=lambda g: (g.memory_gib, g.bandwidth_gbs))
    return min(fits, key=lambda g: (g.memory_gib, -g.bandwidth_gbs))


def gpu(name: str) -> GPU:
    try:
        return GPUS[name]
    except KeyError:
        raise UnknownGPU(f"unknown GPU class {name!r} (one of: {', '.join(GPUS)})") from None


def speed_for(profile, gpu_name: str | None = None, n_ubatch: int = 512):
    """The `SpeedModel` of `profile` on one GPU of class `gpu_name` (default: `default_gpu`), its
    `source` naming the GPU, the model and what the numbers rest on."""
    from slotlab.sim.speed import SpeedModel

    g = gpu(gpu_name) if gpu_name else default_gpu(profile)
    total, active = weights_bytes(profile)
    a, b = GEN_FITS[g.name]
    t_gen = a + b * active / 1e9
    anchor = PREFILL_ANCHOR
    aa, ab = GEN_FITS[anchor["gpu"]]
    t_gen_anchor = aa + ab * anchor["gb"]
    n_active = active * 8 / QUANT_BPW  # the active weights (an MoE's times MOE_FACTOR, as its reads)
    scale = (n_active / anchor["n_params_active"]) * (GPUS[anchor["gpu"]].int8_rate / g.int8_rate)
    table = [(1, t_gen)]
    for m, tps in anchor["tps"]:
        if m > n_ubatch:
            break
        table.append((m, t_gen + max(0.0, m / tps - t_gen_anchor) * scale))
    if table[-1][0] < n_ubatch:  # a larger micro-batch: the last slope
        (m1, t1), (m2, t2) = table[-2], table[-1]
        table.append((n_ubatch, t2 + (t2 - t1) * (n_ubatch - m2) / (m2 - m1)))
    # the anchor's compute rate in FLOP/s: 2 FLOPs a weight and token over its 512-token micro-batch
    m_last, tps_last = anchor["tps"][-1]
    flops = 2 * anchor["n_params_active"] * m_last / (m_last / tps_last - t_gen_anchor)
    flops *= g.int8_rate / GPUS[anchor["gpu"]].int8_rate
    full = profile.layers(swa=False)
    t_ctx = 4 * profile.n_head * profile.n_embd_head_k * len(full) / flops
    kv_full = sum(2 * profile.n_embd_k_gqa(il) for il in full)  # f16 K and V bytes a position
    t_kv = kv_full * b / 1e9
    name = (profile.name or profile.architecture).replace(" (published hyperparameters)", "")
    src = (f"{name} Q4_K_M ({total / 1e9:.1f} GB) on one {g.label}, estimated from llama.cpp measured: generation on "
           f"the {g.label} (pavlokhmel.com, 2026-06), prefill on the RTX 4090 (llama.cpp PR #7860)"
           + ("" if g.name == anchor["gpu"] else " scaled by the spec-sheet int8 tensor rate")
           + "; `slotlab calibrate --url` measures yours")
    lin_t = (table[-1][1] - table[0][1]) / max(1, table[-1][0] - table[0][0])
    return SpeedModel(max(0.0, table[0][1] - lin_t), lin_t, n_ubatch, src, table=tuple(table), t_ctx=t_ctx, t_kv=t_kv)


def fit_note(profile, g: GPU) -> str:
    """'' when the weights fit one GPU of class `g` with 10 % to spare; else what does not fit and the
    smallest shipped class that holds them (the estimate still runs: a user may split the model)."""
    total, _ = weights_bytes(profile)
    if _holds(g, total):
        return ""
    big = default_gpu(profile)
    return (f"the weights ({total / 2**30:.1f} GiB at Q4_K_M) do not fit one {g.label}: the estimate assumes they "
            "do" + (f" (the smallest class that holds them: --gpu {big.name})" if _holds(big, total) else ""))
