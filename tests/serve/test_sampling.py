"""The sampling features of `slotlab serve` on the real model: logit_bias, n_probs / logprobs, GBNF
grammar, json_schema / response_format, n > 1, and the same answers as the real llama-server gave
(tests/serve/golden_sampling.json, recorded by tests/serve/record_sampling.py, as far as rounding on
another CPU cannot change them) and gives on this machine (exactly, when it is built here)."""

import json
import math
import re
from pathlib import Path

import pytest

from bench.build_llama_server import server_binary
from slotlab.llama.grammar import json_schema_to_grammar
from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer, slotlab_serve_command
from tests.serve.record_sampling import FLAGS, PROB_TOL, PROMPT, TOL, generations, run_all, stable_prefix

GOLDEN = json.loads(Path(__file__).with_name("golden_sampling.json").read_text())


@pytest.fixture(scope="module")
def srv():
    with LlamaServer(default_model_path(), FLAGS, command=slotlab_serve_command()) as s:
        yield s


@pytest.fixture(scope="module")
def replayed(srv):
    """The recorded requests sent to slotlab serve, by name."""
    return {r["name"]: r for r in run_all(srv)}


def _greedy(srv, **extra):
    st, r = srv.post("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, **extra})
    assert st == 200, r
    return r


def test_n_probs_top_is_the_greedy_pick(srv):
    r = _greedy(srv, n_probs=4)
    probs = r["completion_probabilities"]
    assert len(probs) == r["tokens_predicted"] == 6
    for p in probs:
        assert len(p["top_logprobs"]) == 4
        assert p["top_logprobs"][0]["id"] == p["id"]  # greedy takes the most probable token
        lps = [t["logprob"] for t in p["top_logprobs"]]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
    assert "".join(p["token"] for p in probs) == r["content"]


def test_logit_bias_forbidding_the_greedy_token_changes_the_output(srv):
    base = _greedy(srv, n_probs=1)
    first = base["completion_probabilities"][0]["id"]
    for lb in ([[first, False]], {str(first): -1000}):
        r = _greedy(srv, logit_bias=lb, n_probs=1)
        assert r["completion_probabilities"][0]["id"] != first
        assert r["content"] != base["content"]


def test_grammar_constrains_the_output(srv):
    st, r = srv.post("/completion", {"prompt": "Is the sky blue? Answer:", "n_predict": 8, "temperature": 0.9,
                                     "seed": 3, "grammar": 'root ::= "yes" | "no"'})
    assert st == 200 and r["content"] in ("yes", "no") and r["stop_type"] == "eos"
    st, r = srv.post("/completion", {"prompt": "x", "n_predict": 2, "grammar": "root ::= ("})
    assert st == 400 and r["error"]["message"] == "Failed to initialize samplers: failed to parse grammar"


def test_json_schema_gives_matching_json(srv):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["city", "n"]}
    st, r = srv.post("/completion", {"prompt": "A city as JSON:", "n_predict": 60, "temperature": 0,
                                     "json_schema": schema})
    assert st == 200 and r["stop_type"] == "eos", r
    obj = json.loads(r["content"])
    assert set(obj) == {"city", "n"} and isinstance(obj["city"], str) and isinstance(obj["n"], int)


def test_n2_gives_two_choices(srv):
    st, r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 5})
    assert st == 200 and [c["index"] for c in r["choices"]] == [0, 1]
    assert all(c["text"] for c in r["choices"])


# ------------------------------------------------------------------ against the real server
#
# Two comparisons. The golden (recorded once, on some CPU) holds on any CPU only where rounding cannot
# decide: each generation is compared up to its first pick whose recorded margin is below THRESHOLD
# (record_sampling.py measured TOL and THRESHOLD across CPUs), its floats within TOL, and everything
# that does not depend on the generated text exactly. Where the real llama-server is built on this
# machine, a second test sends the same requests to it live and compares everything exactly.


def _close(a, b, path="", rel=1e-4, abs_tol=1e-6):
    """Equal, floats to 1e-4 relative (the server sums float32 in its own order)."""
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol), f"{path}: {a} != {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}", rel, abs_tol)
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", rel, abs_tol)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


_KEEP = ("content", "text", "message", "index", "finish_reason", "logprobs", "completion_probabilities", "stop_type",
         "tokens_predicted", "error", "choices", "tokens_evaluated", "usage", "prompt_tokens", "completion_tokens",
         "total_tokens")


def _essential(res):
    """The fields the sampling features decide (no ids, times, model names, timings)."""
    if isinstance(res, list):
        return [_essential(r) for r in res]
    if isinstance(res, dict):
        return {k: _essential(v) for k, v in res.items() if k in _KEEP or k in ("role", "code", "type")}
    return res


# what the generated text decides: compared per generation, up to its first unstable pick
_BY_TEXT = {"content", "text", "logprobs", "completion_probabilities", "stop_type", "finish_reason", "tokens_predicted",
            "completion_tokens", "total_tokens", "has_new_line", "stopping_word", "predicted_n", "tokens"}


def _without_text(res):
    if isinstance(res, list):
        return [_without_text(r) for r in res]
    if isinstance(res, dict):
        return {k: _without_text(v) for k, v in res.items() if k not in _BY_TEXT}
    return res


def _number(x):
    return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__


def _same_shape(a, b, path="", loose=False):
    """The same keys and kinds of value everywhere; below a field the text decides, lists may differ
    in length (more or fewer tokens, other tokens' bytes)."""
    assert _number(a) == _number(b), f"{path}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _same_shape(a[k], b[k], f"{path}.{k}", loose or k in _BY_TEXT)
    elif isinstance(a, list):
        assert loose or len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            _same_shape(x, y, f"{path}[{i}]", loose)


def _same_candidates(got: list, want: list, key: str, path: str) -> None:
    """Top candidates of one position: each id listed by both within TOL (PROB_TOL for probabilities),
    sorted; near-ties may swap and the last places may hold other ids, as long as those are within
    twice the tolerance of the other list's cut."""
    tol = TOL if key == "logprob" else PROB_TOL
    vals = [t[key] for t in got]
    assert vals == sorted(vals, reverse=True), f"{path}: not sorted"
    assert key == "prob" or len(got) == len(want), f"{path}: {len(got)} != {len(want)} candidates"
    g, w = {t["id"]: t for t in got}, {t["id"]: t for t in want}
    for tid in g.keys() & w.keys():
        assert (g[tid]["token"], g[tid]["bytes"]) == (w[tid]["token"], w[tid]["bytes"]), f"{path}: id {tid}"
        assert abs(g[tid][key] - w[tid][key]) <= tol, f"{path}: id {tid}: {g[tid][key]} vs {w[tid][key]}"
    for only, other in ((g.keys() - w.keys(), want), (w.keys() - g.keys(), got)):
        t = {**g, **w}
        cut = other[-1][key] if other else 0.0
        for tid in only:
            assert t[tid][key] <= cut + 2 * tol, f"{path}: id {tid} ({t[tid][key]}) listed on one side only"


def _compare_generation(got: dict, want: dict, m: dict, path: str) -> None:
    """One generation against the golden's: picks, text and probs up to the first unstable pick
    (the candidates of that position too: its prefix is stable); everything when all are stable."""
    n = stable_prefix(m)
    gp, wp = got["probs"] or [], want["probs"] or []
    assert (got["probs"] is None) == (want["probs"] is None), f"{path}: probs listed on one side only"
    for i in range(min(n + 1, len(wp))):
        assert i < len(gp), f"{path}: {len(gp)} probs, the golden's pick {i} is stable"
        g, w = gp[i], wp[i]
        key = "logprob" if "logprob" in w else "prob"
        _same_candidates(g["top_logprobs" if key == "logprob" else "top_probs"],
                         w["top_logprobs" if key == "logprob" else "top_probs"], key, f"{path}[{i}]")
        if i < n:
            assert (g["id"], g["token"], g["bytes"]) == (w["id"], w["token"], w["bytes"]), f"{path}[{i}]: pick"
            assert abs(g[key] - w[key]) <= (TOL if key == "logprob" else PROB_TOL), f"{path}[{i}]: {g[key]} vs {w[key]}"
    if n == len(m["margins"]):  # every pick (the stop's too) is stable: the whole generation
        assert got["text"] == want["text"], path
        assert len(gp) == len(wp) and got["n"] == want["n"], path
    else:
        stable = b"".join(bytes(t["bytes"]) for t in m["tokens"][:n])
        assert (got["text"] or "").encode().startswith(stable), f"{path}: {got['text']!r} lacks {stable!r}"


def compare_with_golden(got: dict, want: dict) -> None:
    """A replayed result against the golden's, as far as rounding cannot decide."""
    name = want["name"]
    assert got["request"] == want["request"], name
    assert got["status"] == want["status"], got["response"]
    _same_shape(got["response"], want["response"], name)
    if want["status"] != 200:
        _close(got["response"], want["response"], name)
        return
    gg, wg = generations(got["response"]), generations(want["response"])
    assert len(gg) == len(wg) == len(want["margins"]), name
    all_stable = True
    for j, (g, w, m) in enumerate(zip(gg, wg, want["margins"])):
        _compare_generation(g, w, m, f"{name}#{j}")
        all_stable &= stable_prefix(m) == len(m["margins"])
    if all_stable:  # how it stopped and the token counts: decided by stable picks only
        for k in ("stop_type", "finish_reason", "tokens_predicted", "completion_tokens", "total_tokens", "has_new_line"):
            assert _find(got["response"], k) == _find(want["response"], k), f"{name}: {k}"
    _close(_without_text(_essential(got["response"])), _without_text(_essential(want["response"])), name)


def _find(x, key):
    """Every value of `key` in x, in document order."""
    if isinstance(x, dict):
        return [v for k, v in x.items() if k == key] + [y for v in x.values() for y in _find(v, key)]
    if isinstance(x, list):
        return [y for v in x for y in _find(v, key)]
    return []


# Known gaps (strict: each fails the run once it is fixed, so the mark comes off): the JSON-schema
# converter slotlab has (llama-cpp-python's port) is older than the server's C++ one (see
# test_json_schema_converts_as_the_server_does), so a schema's grammar admits other whitespace; and a
# chat json_schema is the server's chat-template grammar (generation prompt + content) there.
CONVERTER_GAP = pytest.mark.xfail(strict=True, reason="json_schema_to_grammar: llama-cpp-python's port differs "
                                                      "from the server's C++ converter")
KNOWN_GAPS = {"json_schema": CONVERTER_GAP, "rf_const": CONVERTER_GAP, "chat_json_schema": CONVERTER_GAP,
              "rf_json_schema": CONVERTER_GAP}  # the same text in 8 tokens, the server's 10
NAMES = [r["name"] for r in GOLDEN["results"]]


# The golden cannot show the converter gap: those generations' first picks are grammar-forced, so
# unmeasured (see margins()), and only what rounding cannot change is compared; the live test shows it.
@pytest.mark.parametrize("name", NAMES)
def test_same_answers_as_the_real_server(replayed, name):
    """The golden, as far as rounding on another CPU cannot change it."""
    compare_with_golden(replayed[name], next(r for r in GOLDEN["results"] if r["name"] == name))


def test_the_golden_comparison_can_fail():
    """The margins leave enough to compare, and a wrong pick, logprob or text in the stable part fails."""
    import copy

    picks = [(stable_prefix(m), len(m["margins"])) for r in GOLDEN["results"] for m in r.get("margins", [])]
    assert sum(s > 0 for s, _ in picks) >= 10, picks  # grammar-forced picks are the unmeasured rest
    want = next(r for r in GOLDEN["results"] if r["name"] == "n_probs")
    assert stable_prefix(want["margins"][0]) == len(want["margins"][0]["margins"]) == 6
    compare_with_golden(copy.deepcopy(want), want)
    for spoil in ("id", "logprob", "content"):
        got = copy.deepcopy(want)
        first = got["response"]["completion_probabilities"][0]
        if spoil == "id":
            first["id"] += 1
        elif spoil == "logprob":
            first["logprob"] -= 3 * TOL
        else:
            got["response"]["content"] = "X" + got["response"]["content"][1:]
        with pytest.raises(AssertionError):
            compare_with_golden(got, want)


@pytest.fixture(scope="module")
def live():
    """The same requests on the real llama-server built on this machine."""
    if server_binary() is None:
        pytest.skip("no llama-server built on this machine (`make llama-server` or $SLOTLAB_LLAMA_SERVER): "
                    "the exact comparison needs the real server on the same CPU")
    with LlamaServer(default_model_path(), FLAGS) as s:
        return {r["name"]: r for r in run_all(s)}


@pytest.mark.parametrize("name", [pytest.param(n, marks=KNOWN_GAPS.get(n, ())) for n in NAMES])
def test_same_answers_as_the_real_server_here(live, replayed, name):
    """Everything, exactly (floats to 1e-4): the real server on this CPU rounds as slotlab does."""
    got, want = replayed[name], live[name]
    assert got["request"] == want["request"]
    assert got["status"] == want["status"], got["response"]
    _same_shape(got["response"], want["response"], name)
    _close(_essential(got["response"]), _essential(want["response"]), name)


def _converter_case(i: int, g: dict):
    same = json.dumps(g["schema"]).startswith('{"const"')  # only constants convert alike today
    return pytest.param(i, marks=() if same else CONVERTER_GAP, id=json.dumps(g["schema"])[:40])


@pytest.mark.parametrize("i", [_converter_case(i, g) for i, g in enumerate(GOLDEN["grammars"])])
def test_json_schema_converts_as_the_server_does(i):
    g = GOLDEN["grammars"][i]
    assert g["grammar"] is not None, "the recorder found no converted grammar in the server log"
    mine = json_schema_to_grammar(g["schema"] if g["schema"] else {"type": "object"})
    rules = lambda text: dict(re.findall(r"^(\S+) ::= (.*)$", text, re.M))  # noqa: E731
    assert rules(mine) == rules(g["grammar"])
