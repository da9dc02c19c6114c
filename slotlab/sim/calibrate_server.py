"""`slotlab calibrate --url http://HOST:PORT`: the speed model of a real llama-server, from its own timings.

Why: a simulation's seconds are only as good as its prefill and generation rates, and the rates that
matter are those of the user's GPU, model and build, which only their server knows. `slotlab
calibrate` without `--url` times slotlab's engine on this machine; with it, it asks the server itself:
prompts of several lengths with `cache_prompt: false` (nothing reused: every token is prefilled, one
prompt per request) and one generation, each answer's `timings` (`prompt_ms` / `prompt_n`,
`predicted_per_token_ms`) read back. Each request is made of token ids the server's own `/tokenize`
returned for fresh text, so the lengths are exact in the server's vocabulary.

The fit is the speed model's line: a prompt of n tokens costs ceil(n / n_ubatch) micro-batches of
`t_fixed` plus n `t_token` (least squares over the measured prompts, the median of `--repeats` each);
one generated token costs a one-token decode. The written JSON is what `slotlab simulate --speed` and
`whatif --speed` read, with the server's build and model in its `source`."""

from __future__ import annotations

import json
import math
import statistics
import urllib.error
import urllib.request

from slotlab.errors import ConfigError
from slotlab.sim.speed import SpeedModel

__all__ = ["SIZES", "calibrate_server"]

#: prompt lengths timed (tokens): short ones pin the per-batch cost, long ones the per-token cost
SIZES = (64, 256, 512, 1024, 2048)


def _call(url: str, path: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(url.rstrip("/") + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as ex:
        raise ConfigError(f"calibrate --url {url}: {path} answered {ex.code}: {ex.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as ex:
        raise ConfigError(f"calibrate --url {url}: cannot reach the server ({ex})") from None


def _tokens(url: str, n: int, salt: int) -> list[int]:
    """n token ids of text no other request of the calibration shares (nothing to reuse by chance)."""
    words = " ".join(f"w{salt}x{i} sample{(i * 7919 + salt) % 10007}" for i in range(n))
    toks = _call(url, "/tokenize", {"content": words, "add_special": False})["tokens"]
    if len(toks) < n:
        raise ConfigError(f"calibrate --url {url}: /tokenize gave {len(toks)} tokens for a prompt of {n}")
    return toks[:n]


def calibrate_server(url: str, *, sizes=SIZES, repeats: int = 3, n_generate: int = 64, n_ubatch: int = 512,
                     progress=None) -> tuple[SpeedModel, dict]:
    """(the speed model, the measurements) of the llama-server at `url`."""
    props = _call(url, "/props")
    n_ctx = int(props.get("default_generation_settings", {}).get("n_ctx", 0) or 0)
    sizes = [n for n in sizes if not n_ctx or n + n_generate < n_ctx]
    if len(sizes) < 2:
        raise ConfigError(f"calibrate --url {url}: the server's slots hold {n_ctx} tokens, too few to time "
                          "two prompt lengths: start it with a larger -c")
    prompts, salt = [], 0
    for n in sizes:
        ms = []
        for _ in range(repeats):
            salt += 1
            if progress:
                progress(f"prompt of {n} tokens ({len(ms) + 1}/{repeats})")
            t = _call(url, "/completion", {"prompt": _tokens(url, n, salt), "n_predict": 1, "cache_prompt": False,
                                           "temperature": 0})["timings"]
            if t["prompt_n"] != n:
                raise ConfigError(f"calibrate --url {url}: a {n}-token prompt was timed as {t['prompt_n']} tokens")
            ms.append(t["prompt_ms"])
        prompts.append((n, statistics.median(ms) / 1e3))
    salt += 1
    if progress:
        progress(f"generating {n_generate} tokens")
    g = _call(url, "/completion", {"prompt": _tokens(url, 32, salt), "n_predict": n_generate, "cache_prompt": False,
                                   "temperature": 0, "ignore_eos": True})["timings"]
    per_token = g["predicted_ms"] / max(1, g["predicted_n"]) / 1e3
    # least squares for t = b(n) t_fixed + n t_token, b(n) = ceil(n / n_ubatch), both >= 0
    rows = [(math.ceil(n / n_ubatch), n, t) for n, t in prompts]
    sbb = sum(b * b for b, _, _ in rows)
    sbn = sum(b * n for b, n, _ in rows)
    snn = sum(n * n for _, n, _ in rows)
    sbt = sum(b * t for b, _, t in rows)
    snt = sum(n * t for _, n, t in rows)
    det = sbb * snn - sbn * sbn
    t_fixed, t_token = ((snn * sbt - sbn * snt) / det, (sbb * snt - sbn * sbt) / det) if det else (0.0, 0.0)
    if t_token <= 0:  # the per-token cost cannot be negative: the long prompts alone
        t_fixed, t_token = 0.0, max(1e-9, snt / snn)
    t_fixed = max(0.0, t_fixed)
    build = props.get("build_info", "unknown build")
    model = props.get("model_alias") or props.get("model_path", "unknown model")
    speed = SpeedModel(t_fixed, t_token, n_ubatch,
                       source=f"llama-server at {url} ({build}, {model}): calibrated from its timings",
                       t_decode=max(0.0, per_token - t_fixed - t_token))
    meas = {"url": url, "build": build, "model": model, "prompts": prompts, "generation": {
        "n": g["predicted_n"], "seconds_per_token": per_token}}
    return speed, meas
