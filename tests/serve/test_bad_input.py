"""Bad input on every endpoint: `slotlab serve` answers each recorded request with the real
llama-server's status and error text (tests/serve/golden_bad_input.json, recorded by
tests/serve/record_bad_input.py), and is healthy afterwards. The same cases recorded on b11549
(golden_bad_input_b11549.json, `record_bad_input.py --build b11549`) are answered by
`slotlab serve --server-build 11549` as that server answered them: from b11434 a JSON parse or type
error is a 400, b11549 no longer reads chat_format & co. from a raw completion, /v1/models says the
modalities.

One slotlab serve process for the module; the requests go in the recorded order. What each case
compares is recorded with it (`compare`): the whole JSON body (errors), named fields of a success,
the CORS headers, or the metric names and help lines. A case marked `undefined` is one where the
server's answer is undefined (a negative slot id): slotlab refuses it with a clear 400 instead.

The HTTP-edge fuzz (tests/serve/fuzz_edge.py, golden_bad_input_fuzz.json, recorded by
`record_bad_input.py --fuzz`) runs on a second slotlab serve with an API key: raw requests over
classes (authentication, limits, header syntax, duplicate headers, framing, routes, methods, JSON
oddities, field types), each answered as the real server answered it; where the server's answer is
a fault slotlab does not copy, `fuzz_edge.DIVERGES` names the case and slotlab's documented answer."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer, slotlab_serve_command
from tests.serve import fuzz_edge as F
from tests.serve.record_bad_input import send

GOLDEN = json.loads(Path(__file__).with_name("golden_bad_input.json").read_text())
#: the same cases recorded on newer builds (record_bad_input.py --build B): slotlab serve --server-build B
#: must answer as that server did
BUILDS = {"pin": GOLDEN}
for _b in ("b11434", "b11549"):
    _p = Path(__file__).with_name(f"golden_bad_input_{_b}.json")
    if _p.exists():
        BUILDS[_b] = json.loads(_p.read_text())
FUZZ = json.loads(Path(__file__).with_name("golden_bad_input_fuzz.json").read_text())
FUZZ_CLASSES = sorted({c["class"] for c in FUZZ["cases"]})
MISSING = "<missing>"


@pytest.fixture(scope="module", params=sorted(BUILDS))
def answers(request):
    """(the build's recording, slotlab serve's answers under that build's rules)."""
    golden = BUILDS[request.param]
    extra = [] if request.param == "pin" else ["--server-build", request.param.lstrip("b")]
    d = tempfile.mkdtemp(prefix="bad-input-slots-")
    with LlamaServer(default_model_path(), [*golden["flags"], "--slot-save-path", d, *extra],
                     command=slotlab_serve_command()) as srv:
        got = {c["name"]: send(srv.url, c) for c in golden["cases"]}
        got["/health after"] = send(srv.url, {"method": "GET", "path": "/health", "body": None, "headers": {}})
        got["completion after"] = send(srv.url, {"method": "POST", "path": "/completion", "headers": {},
                                                 "body": json.dumps({"prompt": "Hello", "n_predict": 1})})
    return golden, got


def _path(obj, path: str):
    """A dotted path into a JSON value ("0.tokens", "data.0.meta.n_vocab"); "len:x" its length,
    "keys:x" its sorted keys (x empty: the top level)."""
    op = None
    for p in ("len:", "keys:"):
        if path.startswith(p):
            op, path = p, path[len(p):]
    for k in [k for k in path.split(".") if k] if path else []:
        if isinstance(obj, list) and k.isdigit() and int(k) < len(obj):
            obj = obj[int(k)]
        elif isinstance(obj, dict) and k in obj:
            obj = obj[k]
        else:
            return MISSING
    if op == "len:":
        return len(obj)
    if op == "keys:":
        return sorted(obj)
    return obj


def _metrics(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#")]


@pytest.mark.parametrize("name", [c["name"] for c in GOLDEN["cases"]])
def test_answer_is_the_servers(answers, name):
    golden, answers = answers
    case = next(c for c in golden["cases"] if c["name"] == name)
    got = answers[case["name"]]
    if case.get("undefined"):
        assert got["status"] == 400 and got["response"]["error"]["type"] == "invalid_request_error", got
        assert "negative" in got["response"]["error"]["message"]
        return
    assert got["status"] == case["status"], (got, case["response"])
    cmp = case["compare"]
    if cmp == "body" and case["status"] == 200:  # an error on the pin, answered on a newer build
        assert {k: v for k, v in got["response"].items() if k != "timings"} == \
            {k: v for k, v in case["response"].items() if k != "timings"}
    elif cmp == "body":
        assert got["response"] == case["response"]
    elif cmp == "headers":
        assert got["response_headers"] == case["response_headers"]
    elif cmp == "metrics":
        assert _metrics(got["response"]) == _metrics(case["response"])
    elif isinstance(cmp, list):
        for path in cmp:
            assert _path(got["response"], path) == _path(case["response"], path), path


def test_healthy_afterwards(answers):
    golden, answers = answers
    assert golden["after"] == {"health": 200, "completion": 200}
    assert answers["/health after"]["status"] == 200
    after = answers["completion after"]
    assert after["status"] == 200 and after["response"]["tokens_predicted"] == 1


@pytest.fixture(scope="module")
def fuzz_answers():
    d = tempfile.mkdtemp(prefix="bad-input-fuzz-slots-")
    with LlamaServer(default_model_path(), [*FUZZ["flags"], "--slot-save-path", d],
                     command=slotlab_serve_command()) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        got = {c["name"]: F.view(c, F.send(host, int(port), c)) for c in F.cases()}
        got["completion after"] = send(srv.url, {"method": "POST", "path": "/completion", "body": json.dumps(
            {"prompt": "Hello", "n_predict": 1}), "headers": {"Authorization": "Bearer " + F.KEY}})
    return got


def test_fuzz_generator_is_the_recorded_one():
    """The cases are regenerated, not stored: the same names and bytes as when the server answered."""
    assert FUZZ["flags"] == F.FLAGS and FUZZ["seed"] == F.SEED
    assert [(c["name"], c["digest"]) for c in F.cases()] == [(c["name"], c["digest"]) for c in FUZZ["cases"]]
    assert len(FUZZ["cases"]) >= 500 and len(FUZZ_CLASSES) >= 9


@pytest.mark.parametrize("cls", FUZZ_CLASSES)
def test_fuzz_class_answers_are_the_servers(fuzz_answers, cls):
    cases = [c for c in FUZZ["cases"] if c["class"] == cls]
    wrong = []
    for c in cases:
        got = fuzz_answers[c["name"]]
        want = F.DIVERGES.get(c["name"], {}).get("slotlab", c["answer"])
        if not (want(got) if callable(want) else got == want):
            wrong.append(f"{c['name']}\n  want {json.dumps(c['answer'], ensure_ascii=False)[:300]}"
                         f"\n  got  {json.dumps(got, ensure_ascii=False)[:300]}")
    assert not wrong, f"{len(wrong)} of {len(cases)} differ:\n" + "\n".join(wrong)


def test_fuzz_divergences_are_the_servers_faults():
    """Every documented divergence names a recorded case whose server answer is what it says."""
    recorded = {c["name"]: c["answer"] for c in FUZZ["cases"]}
    for name, d in F.DIVERGES.items():
        assert name in recorded, name
        assert d["server"](recorded[name]), (name, recorded[name])


def test_fuzz_healthy_afterwards(fuzz_answers):
    after = fuzz_answers["completion after"]
    assert after["status"] == 200 and after["response"]["tokens_predicted"] == 1
