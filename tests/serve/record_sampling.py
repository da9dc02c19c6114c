"""Record the real llama-server's answers to the sampling features of the HTTP contract: greedy
generations with `n_probs` / `post_sampling_probs` / OpenAI `logprobs`, `logit_bias` in its array and
object forms, GBNF `grammar`, `json_schema` and `response_format`, `n` > 1, and their errors; plus
the GBNF the server converts each JSON schema to (from its debug log).

    python -m tests.serve.record_sampling     -> tests/serve/golden_sampling.json
    python -m tests.serve.record_sampling --noise OLD.json NEW.json   # float noise between two recordings

Each generation also gets the margin by which each pick won (a second, fresh server answers the same
requests asking for K candidates a token: see margins()), so that tests/serve/test_sampling.py, which
sends the same REQUESTS to `slotlab serve`, compares only what float rounding on another CPU cannot
change."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

OUT = Path(__file__).with_name("golden_sampling.json")
FLAGS = ["-c", "2048", "-np", "2"]
# a prompt whose greedy picks win by far (margins 1.5-3 logprob): the golden then compares whole
# generations on any CPU ("The capital of France is", its first prompt, has a pick that wins by 0.02)
PROMPT = "One, two, three, four,"
CHAT = [{"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "Write an example"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
# the schemas of the server's own tests (tools/server/tests/unit/test_chat_completion.py) and one more
SCHEMAS = [{"const": "42"}, {"items": [{"type": "integer"}]}, {"const": "foooooo"}, {"type": "object"}, PERSON]

G = {"temperature": 0}
REQUESTS: list[tuple[str, str, dict]] = [
    ("n_probs", "/completion", {"prompt": PROMPT, "n_predict": 6, "n_probs": 5, **G}),
    ("n_probs_post", "/completion", {"prompt": PROMPT, "n_predict": 6, "n_probs": 5, "post_sampling_probs": True, **G}),
    ("n_probs_post_temp", "/completion", {"prompt": PROMPT, "n_predict": 4, "n_probs": 4, "post_sampling_probs": True,
                                          "temperature": 0.8, "seed": 42, "top_k": 10}),
    ("seeded", "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 1.0, "seed": 7, "top_k": 20,
                               "repeat_penalty": 1.3, "min_keep": 2}),
    ("logit_bias_id", "/completion", {"prompt": PROMPT, "n_predict": 6, "logit_bias": [["@GREEDY0", False]],
                                      "n_probs": 3, **G}),
    ("logit_bias_str", "/completion", {"prompt": PROMPT, "n_predict": 6, "logit_bias": {" five": -100}, **G}),
    ("logit_bias_obj_id", "/completion", {"prompt": PROMPT, "n_predict": 6, "logit_bias": {"@GREEDY0": False}, **G}),
    ("grammar_yes_no", "/completion", {"prompt": "Is the sky blue? Answer:", "n_predict": 4,
                                       "grammar": 'root ::= "yes" | "no"', **G}),
    ("grammar_a5", "/completion", {"prompt": PROMPT, "n_predict": 8, "grammar": 'root ::= "a"{5,5}', **G}),
    ("json_schema", "/completion", {"prompt": "A person as JSON:", "n_predict": 40, "json_schema": PERSON, **G}),
    ("grammar_bad", "/completion", {"prompt": PROMPT, "n_predict": 4, "grammar": "root ::= (", **G}),
    ("oai_text_logprobs", "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "logprobs": 3, **G}),
    ("oai_chat_logprobs", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "logprobs": True,
                                                   "top_logprobs": 3, **G}),
    ("oai_chat_top_without", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "top_logprobs": 3, **G}),
    ("rf_const", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "response_format":
                                          {"type": "json_object", "schema": {"const": "42"}}, **G}),
    ("rf_json_schema", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 10, "response_format":
                                                {"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}},
                                                **G}),
    ("rf_sound", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "response_format": {"type": "sound"}, **G}),
    ("chat_json_schema", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "json_schema": {"const": "42"},
                                                  **G}),
    ("n2_text", "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "n": 2, **G}),
    ("n2_completion", "/completion", {"prompt": PROMPT, "n_predict": 4, "n": 2, **G}),
    ("n_too_many", "/completion", {"prompt": PROMPT, "n_predict": 4, "n": 3, **G}),
]


def resolve(body, greedy0: int):
    """Put the greedy run's first token where a request names `@GREEDY0` (an id in an array, its
    decimal text as an object key)."""
    if isinstance(body, dict):
        return {(str(greedy0) if k == "@GREEDY0" else k): resolve(v, greedy0) for k, v in body.items()}
    if isinstance(body, list):
        return [resolve(v, greedy0) for v in body]
    return greedy0 if body == "@GREEDY0" else body


def run_all(srv, probe: bool = False) -> list[dict]:
    """Send REQUESTS (the first one's first token resolves @GREEDY0); status and body each. With
    `probe`, each request asks for K candidates a token instead (probe_request): the same sequence,
    so the same slots and cache states, hence the same batch shapes and floats as the plain run."""
    out = []
    greedy0 = None
    for name, path, body in REQUESTS:
        if greedy0 is not None:
            body = resolve(body, greedy0)
        status, res = srv.post(*(probe_request(path, body) if probe else (path, body)))
        if greedy0 is None:
            greedy0 = res["completion_probabilities"][0]["id"]
        out.append({"name": name, "path": path, "request": body, "status": status, "response": res})
    return out


# ------------------------------------------------------------------ margins: what rounding cannot flip
#
# A golden generation holds on another CPU only as far as each pick wins by more than the float noise
# between CPUs. So the recorder keeps, for every generated token, the margin by which the server's pick
# won, and the test compares ids, text and probs only up to the first pick whose margin is below the
# threshold, floats within the tolerance.
#
# Measured: the Intel golden (git show cee92be:tests/serve/golden_sampling.json) against the same
# REQUESTS on the real llama-server on an AMD EPYC (AVX-512 + VNNI + bf16, no AMX), every float of
# identical positions (same prefix), `python -m tests.serve.record_sampling --noise OLD.json NEW.json`:
#   logprob  63 floats, median 0.071, largest 0.378
#   lead     39 leads,  median 0.107, largest 0.395  (a pick's logprob less another candidate's)
#   prob     13 floats, median 0.0043, largest 0.011 (post-sampling probabilities)
# and 5 greedy generations differ (' the capital of the country of' there, '... French Republic' here,
# where the pick won by 0.02). slotlab against the real server on the same CPU: leads within 5e-7.
TOL = 0.6             # logprob floats: 1.5 x the largest logprob difference measured
THRESHOLD = 0.8       # logprob margin: 2 x the largest lead difference measured
PROB_TOL = 0.05       # post-sampling probabilities (4 x the largest measured: a small sample)
# a sampled pick: rnd's distance to its interval's ends. The ends move by the probability noise, and
# by the mass of a candidate a truncation (top_p, min_p) takes in or out on another CPU: <= 0.05.
PROB_THRESHOLD = 0.1
K = 20            # competitors a probe asks for


def _temperature(path: str, body: dict) -> float:
    return float(body.get("temperature", 0.8 if path == "/completion" else 1.0))


def _constrained(path: str, body: dict) -> bool:
    """A grammar removes competitors the raw logprobs still list (grammar, json_schema,
    response_format with a schema)."""
    rf = body.get("response_format") or {}
    return bool(body.get("grammar") or body.get("json_schema") or rf.get("schema") or rf.get("json_schema"))


def probe_request(path: str, body: dict) -> tuple[str, dict]:
    """The same request asking for K candidates a token: raw logprobs for a greedy pick, the
    post-sampling distribution for a sampled one (n_probs changes nothing of the sampling)."""
    sampled = _temperature(path, body) > 0
    if path == "/completion":
        return path, {**body, "n_probs": max(K, body.get("n_probs", 0)), "post_sampling_probs": sampled}
    if path == "/v1/completions":
        return path, {**body, "logprobs": K}
    return path, {**body, "logprobs": True, "top_logprobs": K}


def generations(res) -> list[dict]:
    """Each generation of a response (a /completion body, a list of them, or an OpenAI body):
    text, per-token probs, and the number of sampled tokens when the response says it."""
    if isinstance(res, list):
        return [g for r in res for g in generations(r)]
    if "choices" in res:
        out = []
        for c in res["choices"]:
            text = c["message"]["content"] if "message" in c else c.get("text")
            out.append({"text": text, "probs": ((c.get("logprobs") or {}).get("content")), "n": None})
        if len(out) == 1:
            out[0]["n"] = (res.get("usage") or {}).get("completion_tokens")
        return out
    return [{"text": res.get("content"), "probs": res.get("completion_probabilities"), "n": res.get("tokens_predicted")}]


def _biases(res) -> dict[int, float]:
    """token -> bias from the response's generation_settings (null = banned)."""
    gs = (res[0] if isinstance(res, list) else res).get("generation_settings") or {}
    return {b["token"]: (-math.inf if b["bias"] is None else b["bias"]) for b in gs.get("logit_bias", [])}


def greedy_margin(entry: dict, bias: dict[int, float], constrained: bool) -> float | None:
    """The pick's biased logprob less the best other one's. Tokens past the K listed are at most
    the last listed (plus the largest positive bias). Under a grammar the raw list still holds
    forbidden tokens: the margin bounds the true one only when the pick beats them all, else None."""
    top = entry.get("top_logprobs")
    if top is None:  # post-sampling probs of a greedy pick say nothing of its competitors
        return None
    chosen = entry["logprob"] + bias.get(entry["id"], 0.0)
    others = [t["logprob"] + bias.get(t["id"], 0.0) for t in top if t["id"] != entry["id"]]
    if len(top) >= K:
        others.append(top[-1]["logprob"] + max([0.0, *bias.values()]))
    m = chosen - max(others, default=-math.inf)
    if constrained and m <= 0:
        return None
    return m


class MT19937:
    """std::mt19937, the dist sampler's generator (seeded with the request's seed)."""

    def __init__(self, seed: int):
        self.mt = [seed & 0xFFFFFFFF]
        for i in range(1, 624):
            self.mt.append((1812433253 * (self.mt[-1] ^ (self.mt[-1] >> 30)) + i) & 0xFFFFFFFF)
        self.i = 624

    def __call__(self) -> int:
        if self.i >= 624:
            mt = self.mt
            for k in range(624):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
                mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def uniform(self) -> float:
        """std::uniform_real_distribution<double>(0, 1) in libstdc++ (generate_canonical, 2 draws)."""
        lo = self()
        hi = self()
        r = (lo + hi * 2.0 ** 32) / 2.0 ** 64
        return r if r < 1.0 else math.nextafter(1.0, 0.0)


def sampled_margin(entry: dict, rnd: float) -> float | None:
    """llama_sampler_dist picks the first candidate whose running sum reaches rnd: the margin is
    rnd's distance to the ends of the pick's interval. None when the draw does not explain the pick
    (the replayed generator or the candidate list disagree) or the interval is not all listed."""
    cum = 0.0
    for t in entry["top_probs"]:
        lo, cum = cum, cum + t["prob"]
        if cum >= rnd:
            return min(rnd - lo, cum - rnd) if t["id"] == entry["id"] else None
    return None


def margins(path: str, body: dict, probe) -> list[dict]:
    """Per generation of the probe's response: the kind of margin, one margin a sampled token (None:
    not measurable) and the tokens (id, bytes). A generation that stopped on EOS without the server
    listing the EOS pick gets one None more: its stop stays unmeasured."""
    constrained = _constrained(path, body)
    sampled = _temperature(path, body) > 0
    out = []
    for el in (probe if isinstance(probe, list) else [probe]):
        bias = _biases(el)
        seed = (el.get("generation_settings") or {}).get("seed")  # a child's seed is the parent's + j
        for g in generations(el):
            probs = g["probs"] or []
            if not sampled:
                ms = [greedy_margin(e, bias, constrained) for e in probs]
            elif constrained or seed is None or seed == 0xFFFFFFFF or path != "/completion":
                ms = [None] * len(probs)  # the draw cannot be replayed (or a grammar resamples)
            else:
                rng = MT19937(seed)
                ms = [sampled_margin(e, rng.uniform()) for e in probs]
            if g["n"] is not None and g["n"] > len(ms):
                ms += [None] * (g["n"] - len(ms))
            elif g["n"] is None and not ms and g["text"]:
                ms = [None]  # text but no probs: nothing measured
            out.append({"kind": "prob" if sampled else "logprob", "margins": ms,
                        "tokens": [{"id": e["id"], "bytes": e["bytes"]} for e in probs]})
    return out


def stable_prefix(m: dict, threshold: float = THRESHOLD, prob_threshold: float = PROB_THRESHOLD) -> int:
    """How many leading picks of a generation win by at least the threshold."""
    thr = prob_threshold if m["kind"] == "prob" else threshold
    n = 0
    for x in m["margins"]:
        if x is None or x < thr:
            break
        n += 1
    return n


def attach_margins(results: list[dict], probes: list[dict]) -> None:
    """Give each answered result its generations' margins from the probe run. A probe that
    generated other text (it must not) leaves every token of that result unstable, said aloud."""
    for r, p in zip(results, probes, strict=True):
        if r["status"] != 200:
            continue
        ms = margins(r["path"], r["request"], p["response"]) if p["status"] == 200 else []
        same = p["status"] == 200 and [g["text"] for g in generations(p["response"])] == \
            [g["text"] for g in generations(r["response"])]
        if not same:
            print(f"{r['name']}: the probe generated other text; every token counted unstable")
            ms = [{"kind": m["kind"], "margins": [None] * len(m["margins"]), "tokens": []} for m in ms]
        r["margins"] = ms


def _floats_at_same_positions(old: dict, new: dict):
    """(name, what, old, new) for every float two recordings hold at identical positions: the
    generations' token probs before their first differing pick, matched by token id."""
    for ro in old["results"]:
        rn = next((r for r in new["results"] if r["name"] == ro["name"]), None)
        if rn is None or ro["status"] != 200 or rn["status"] != 200:
            continue
        for go, gn in zip(generations(ro["response"]), generations(rn["response"])):
            for eo, en in zip(go["probs"] or [], gn["probs"] or []):
                key = "logprob" if "logprob" in eo else "prob"
                tops = "top_logprobs" if key == "logprob" else "top_probs"
                top_n = {t["id"]: t[key] for t in en[tops]}
                if eo["id"] == en["id"]:
                    if key == "logprob":  # the pick's lead over each other candidate listed by both
                        for t in eo[tops]:
                            if t["id"] != eo["id"] and t["id"] in top_n:
                                yield ro["name"], "lead", eo[key] - t[key], en[key] - top_n[t["id"]]
                for t in eo[tops]:
                    if t["id"] in top_n:
                        yield ro["name"], key, t[key], top_n[t["id"]]
                if eo["id"] != en["id"]:
                    break  # later positions have other prefixes


def noise(old: dict, new: dict) -> dict:
    """The float noise between two recordings of REQUESTS (e.g. two CPUs): per kind (logprob, prob,
    and "lead": a pick's logprob less another candidate's, what a margin is made of) the number of
    floats compared and the median / 99th percentile / largest absolute difference; and the
    generations whose text differs, with the margins the new recording measured for them."""
    diffs: dict[str, list[float]] = {}
    for _, key, a, b in _floats_at_same_positions(old, new):
        diffs.setdefault(key, []).append(abs(a - b))
    out = {}
    for k, d in diffs.items():
        d.sort()
        out[k] = {"n": len(d), "median": d[len(d) // 2], "p99": d[min(len(d) - 1, int(len(d) * 0.99))],
                  "max": d[-1]}
    flips = []
    for ro in old["results"]:
        rn = next((r for r in new["results"] if r["name"] == ro["name"]), None)
        if rn is None or ro["status"] != 200 or "margins" not in rn:
            continue
        for gi, (go, gn) in enumerate(zip(generations(ro["response"]), generations(rn["response"]))):
            if go["text"] != gn["text"]:
                m = rn["margins"][gi]
                pos = next((i for i, (a, b) in enumerate(zip(go["probs"] or [], gn["probs"] or []))
                            if a["id"] != b["id"]), None)
                flips.append({"name": ro["name"], "old": go["text"], "new": gn["text"], "first_diff": pos,
                              "margins": m["margins"]})
    out["differing_texts"] = flips
    return out


def converted_grammars(log_text: str) -> list[str]:
    """The server's `Converted grammar: ...` debug lines (each grammar runs to the next log line)."""
    out = []
    for m in re.finditer(r"Converted grammar: (.*?)\n(?=\d+\.\d+\.\d+\.\d+ [A-Z] )", log_text, re.S):
        out.append(m.group(1).rstrip("\n") + "\n")
    return out


def record_grammars() -> list[dict]:
    """One /completion per schema on a verbose server, reading back its conversion."""
    out = []
    with LlamaServer(default_model_path(), [*FLAGS, "-v"]) as srv:
        for schema in SCHEMAS:
            before = srv.log_path.read_text()
            status, _ = srv.post("/completion", {"prompt": "x", "n_predict": 1, "json_schema": schema})
            after = srv.log_path.read_text()[len(before):]
            got = converted_grammars(after)
            out.append({"schema": schema, "status": status, "grammar": got[0] if got else None})
    return out


def main() -> int:
    if sys.argv[1:2] == ["--noise"]:  # --noise OLD.json NEW.json: the float noise between recordings
        old, new = (json.loads(Path(f).read_text()) for f in sys.argv[2:4])
        print(json.dumps(noise(old, new), indent=1))
        return 0
    with LlamaServer(default_model_path(), FLAGS) as srv:
        results = run_all(srv)
    with LlamaServer(default_model_path(), FLAGS) as srv:  # a fresh server: the same cache states
        attach_margins(results, run_all(srv, probe=True))
    grammars = record_grammars()
    OUT.write_text(json.dumps({"flags": FLAGS, "results": results, "grammars": grammars}, indent=1, ensure_ascii=False) + "\n")
    for r in results:
        print(r["name"], r["status"], json.dumps(r["response"])[:160])
        for m in r.get("margins", []):
            print("   ", m["kind"], "stable", stable_prefix(m), "of", len(m["margins"]),
                  [None if x is None else round(x, 3) for x in m["margins"]])
    for g in grammars:
        print(json.dumps(g["schema"]), repr(g["grammar"])[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
