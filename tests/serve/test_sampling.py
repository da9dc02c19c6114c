"""The sampling features of `slotlab serve` on the real model: logit_bias, n_probs / logprobs, GBNF
grammar, json_schema / response_format, n > 1, and the same answers as the real llama-server gave
(tests/serve/golden_sampling.json, recorded by tests/serve/record_sampling.py)."""

import json
import math
import re
from pathlib import Path

import pytest

from slotlab.llama.grammar import json_schema_to_grammar
from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer, slotlab_serve_command
from tests.serve.record_sampling import FLAGS, PROMPT, run_all

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


def _close(a, b, path=""):
    """Equal, floats to 1e-4 relative (the server sums float32 in its own order)."""
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6), f"{path}: {a} != {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


_KEEP = ("content", "text", "message", "index", "finish_reason", "logprobs", "completion_probabilities", "stop_type",
         "tokens_predicted", "error", "choices")


def _essential(res):
    """The fields the sampling features decide (no ids, times, model names, timings)."""
    if isinstance(res, list):
        return [_essential(r) for r in res]
    if isinstance(res, dict):
        return {k: _essential(v) for k, v in res.items() if k in _KEEP or k in ("role", "code", "type")}
    return res


# Known gaps (strict: each fails the run once it is fixed, so the mark comes off): the JSON-schema
# converter slotlab has (llama-cpp-python's port) is older than the server's C++ one (see
# test_json_schema_converts_as_the_server_does), so a schema's grammar admits other whitespace; and a
# chat json_schema is the server's chat-template grammar (generation prompt + content) there.
CONVERTER_GAP = pytest.mark.xfail(strict=True, reason="json_schema_to_grammar: llama-cpp-python's port differs "
                                                      "from the server's C++ converter")
KNOWN_GAPS = {"json_schema": CONVERTER_GAP, "rf_const": CONVERTER_GAP, "chat_json_schema": CONVERTER_GAP}


@pytest.mark.parametrize("name", [pytest.param(r["name"], marks=KNOWN_GAPS.get(r["name"], ()))
                                  for r in GOLDEN["results"]])
def test_same_answers_as_the_real_server(replayed, name):
    want = next(r for r in GOLDEN["results"] if r["name"] == name)
    got = replayed[name]
    assert got["request"] == want["request"]
    assert got["status"] == want["status"], got["response"]
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
