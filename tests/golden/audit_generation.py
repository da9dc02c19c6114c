"""Audit: can a golden trace's decisions change on another CPU through the generated text?

The golden traces compare no text (test_golden.py strips `content`), but a slot (or a RAM-cache
entry) holds its prompt *and* the tokens it generated, and a later prompt is matched against both:
where a later prompt extends an earlier one, the match goes on into the earlier request's generation,
so cache_n, f_keep / f_sim and the slot chosen by similarity could follow a pick that float rounding
flips on another CPU. Generated lengths cannot change (every trace request has ignore_eos and a fixed
n_predict), so the ways in are the generated positions a later prompt is matched against, and (two
traces, WHOLE_ANSWER) decisions that read whole answers. (A --cache-reuse chunk needs n_cache_reuse
tokens in a row to match: another CPU would have to flip several picks into the later prompt's tokens.)

For every request j and every earlier request i whose prompt tokens are a strict prefix of j's, this
re-generates i greedily (one sequence) and walks the generation against j's continuation: a pick that
equals j's next token must win against every other token (a flip would end the match), and the first
pick that differs must win against j's next token (only that token would extend the match). The
smallest such logprob margin of a trace is what rounding would have to overcome; below
tests.serve.record_sampling.THRESHOLD the trace is at risk. For the traces of WHOLE_ANSWER, whose
decisions read whole answers, every pick of every request counts (against its runner-up).

THRESHOLD comes from the cross-CPU noise of the default model's Q4_K_M weights. The tiny hybrid /
recurrent models (traces_tiny/) hold F32 weights only: their rounding differs by float32 summation
order (~1e-5 on a logit), far below the smallest margin this finds there (0.26), so they hold.

    python -m tests.golden.audit_generation [NAME ...]      # every trace of traces/ and traces_tiny/"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tests.golden.trace_models import split_model
from tests.serve.record_sampling import THRESHOLD

DIRS = [Path(__file__).with_name("traces"), Path(__file__).with_name("traces_tiny")]
# traces whose decisions read generated tokens beyond a prompt match (tests/sim/test_paper_golden.py's
# GENERATED_CONTENT: chunks of an answer reused by --cache-reuse; two answers equal, so a save is skipped)
WHOLE_ANSWER = {"cache_reuse_request_off", "defaults_single_slot_checkpoints"}


def _logprobs(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def generate(ctx, tokens: np.ndarray, n: int) -> list[tuple[int, np.ndarray]]:
    """Greedy picks after `tokens` with the logprobs each was picked from (one sequence, fresh KV)."""
    from slotlab.llama import Batch

    ctx.clear()
    b = Batch(max(len(tokens), 1))
    idx = b.add_seq(tokens, 0, 0, logits_last=True)
    assert ctx.decode(b) == 0
    out, pos = [], len(tokens)
    for _ in range(n):
        lp = _logprobs(ctx.logits(idx))
        t = int(lp.argmax())
        out.append((t, lp))
        b.clear()
        idx = b.add(t, pos, 0, logits=True)
        pos += 1
        assert ctx.decode(b) == 0
    return out


def audit_trace(path: Path, model) -> dict:
    """The pairs (i, j) where j's prompt extends i's, each with the smallest margin on the way."""
    from slotlab.llama import Context

    trace = json.loads(path.read_text())
    rec = path.with_name(f"{path.stem}.llama-server.json")
    recorded = [r.get("content") for r in json.loads(rec.read_text())["results"]] if rec.exists() else []
    reqs = [(k, r) for k, r in enumerate(trace["requests"]) if isinstance(r.get("prompt"), str)]
    toks = {k: model.tokenize(r["prompt"]) for k, r in reqs}
    n_ctx = max(len(t) for t in toks.values()) + 64
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=512, swa_full=True)
    gens: dict[int, list] = {}
    pairs = []
    try:
        for jj, (j, rj) in enumerate(reqs):
            for i, ri in reqs[:jj]:
                pi, pj = toks[i], toks[j]
                if not (len(pj) > len(pi) and np.array_equal(pj[:len(pi)], pi)):
                    continue
                n = ri.get("n_predict", -1)
                n = n if n >= 0 else 16
                if i not in gens:
                    gens[i] = generate(ctx, pi, n)
                worst, matched = float("inf"), 0
                for k, (t, lp) in enumerate(gens[i]):
                    if len(pi) + k >= len(pj):
                        break
                    want = int(pj[len(pi) + k])
                    if t == want:  # matched: any flip ends the match
                        worst = min(worst, float(lp[t] - np.partition(lp, -2)[-2]))
                        matched += 1
                        continue
                    worst = min(worst, float(lp[t] - lp[want]))  # only `want` would extend it
                    break
                pairs.append({"i": i, "j": j, "matched": matched, "margin": worst,
                              "text": model.detokenize([t for t, _ in gens[i]]),
                              "recorded": recorded[i] if i < len(recorded) else None})
        if path.stem in WHOLE_ANSWER:  # the decision reads the whole answer: every pick counts
            for i, ri in reqs:
                n = ri.get("n_predict", -1)
                if i not in gens:
                    gens[i] = generate(ctx, toks[i], n if n >= 0 else 16)
                m = min((float(lp[t] - np.partition(lp, -2)[-2]) for t, lp in gens[i]), default=float("inf"))
                pairs.append({"i": i, "j": None, "matched": len(gens[i]), "margin": m,
                              "text": model.detokenize([t for t, _ in gens[i]]),
                              "recorded": recorded[i] if i < len(recorded) else None})
    finally:
        ctx.close()
    return {"name": path.stem, "pairs": pairs, "min_margin": min((p["margin"] for p in pairs), default=None)}


def main(names: list[str]) -> int:
    from slotlab.llama import Model
    from slotlab.llama.model import default_model_path

    models: dict = {}
    at_risk = 0
    for d in DIRS:
        for p in sorted(d.glob("*.json")):
            if ".llama-server" in p.name or (names and p.stem not in names):
                continue
            mpath, _ = split_model(json.loads(p.read_text())["flags"])
            mpath = mpath or default_model_path()
            model = models.get(mpath) or models.setdefault(mpath, Model(mpath))
            a = audit_trace(p, model)
            m = a["min_margin"]
            risk = m is not None and m < THRESHOLD
            at_risk += risk
            same = sum(pr["text"] == pr["recorded"] for pr in a["pairs"])
            print(f"{d.name}/{a['name']}: {len(a['pairs'])} extending pairs, smallest margin "
                  f"{'-' if m is None else round(m, 3)}{'  AT RISK' if risk else ''}; "
                  f"generated here as recorded: {same} of {len(a['pairs'])}")
            for pr in a["pairs"]:
                if pr["margin"] < THRESHOLD or pr["matched"]:
                    print(f"    {pr['i']} -> {'all picks' if pr['j'] is None else pr['j']}: matched {pr['matched']}, margin {pr['margin']:.3f}, "
                          f"generated {pr['text']!r} (recorded {pr['recorded']!r})")
    print(f"{at_risk} traces at risk (margin below {THRESHOLD})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
