"""Record how the real llama-server answers bad input: wrong types, NaN, huge, negative and missing
values, broken JSON, on every endpoint slotlab serves.

    python -m tests.serve.record_bad_input            # needs `make llama-server`
    python -m tests.serve.record_bad_input --slotlab  # the same cases against `slotlab serve` (a diff)
    python -m tests.serve.record_bad_input --fuzz     # the HTTP-edge fuzz (tests/serve/fuzz_edge.py)
    python -m tests.serve.record_bad_input --fuzz --slotlab  # its cases against `slotlab serve`: the diff
    python -m tests.serve.record_bad_input --fuzz --missing  # record only the cases the golden lacks

writes tests/serve/golden_bad_input.json, which tests/serve/test_bad_input.py compares `slotlab serve`
with. Each case is sent as raw bytes (so `NaN`, an empty body or cut-off JSON reach the server as
written) in order, to one server started with FLAGS; every completion that can succeed asks for at
most two tokens. What is compared is chosen per case (`compare`): the whole body for errors, named
fields of a success (values that depend on sampling or time are left out)."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer, slotlab_serve_command

OUT = Path(__file__).with_name("golden_bad_input.json")
FUZZ_OUT = Path(__file__).with_name("golden_bad_input_fuzz.json")
FLAGS = ["-np", "2", "-c", "2048", "--metrics"]  # + --slot-save-path DIR
GEN = {"n_predict": 1, "temperature": 0}
CHAT = [{"role": "user", "content": "hi"}]
ORIGIN = {"Origin": "http://web.example"}


def _c(name, path, body=None, method="POST", compare="body", headers=None, **kw) -> dict:
    """One case: `body` a dict/list (sent as JSON) or a str (sent as written); `compare` is "body"
    (the whole JSON answer), a list of dotted paths into it, or "status"."""
    raw = body if isinstance(body, str) or body is None else json.dumps(body)
    return {"name": name, "method": method, "path": path, "body": raw, "headers": headers or {},
            "compare": compare, **kw}


def _cmpl(name, extra, compare="body", path="/completion", **kw):
    return _c(name, path, {"prompt": "hi", **GEN, **extra} if isinstance(extra, dict) else extra,
              compare=compare, **kw)


GS = "generation_settings."
CASES = [
    # ---- /completion: the request schema (server-schema.cpp)
    _cmpl("temperature string", {"temperature": "nan"}),
    _cmpl("temperature NaN literal", '{"prompt": "hi", "n_predict": 1, "temperature": NaN}'),
    _cmpl("temperature Infinity literal", '{"prompt": "hi", "n_predict": 1, "temperature": Infinity}'),
    _cmpl("temperature -Infinity literal", '{"prompt": "hi", "n_predict": 1, "temperature": -Infinity}'),
    _cmpl("temperature negative clamps to 0", {"temperature": -3}, [GS + "temperature", "tokens_predicted"]),
    _cmpl("temperature huge", {"temperature": 1e300, "n_predict": 0}, [GS + "temperature"]),
    _cmpl("temperature bool", {"temperature": True, "n_predict": 0}, [GS + "temperature"]),
    _cmpl("n_predict string", {"n_predict": "3"}),
    _cmpl("n_predict negative", {"n_predict": -5}),
    _cmpl("n_predict huge float", {"n_predict": 1e30}),
    _cmpl("n_predict 2^31", {"n_predict": 2147483648}),
    _cmpl("n_predict 2^32+1 wraps to 1", {"n_predict": 4294967297}, ["tokens_predicted", GS + "n_predict"]),
    _cmpl("n_predict beyond uint64", '{"prompt": "hi", "n_predict": 100000000000000000000}'),
    _cmpl("n_predict -2^63 wraps to 0", {"n_predict": -9223372036854775808}, ["tokens_predicted", GS + "n_predict"]),
    _cmpl("n_predict true", {"n_predict": True}, ["tokens_predicted", GS + "n_predict"]),
    _cmpl("n_predict 1.9", {"n_predict": 1.9}, ["tokens_predicted", GS + "n_predict"]),
    _cmpl("n_predict null falls back to max_tokens", {"n_predict": None, "max_tokens": 2},
          ["tokens_predicted", GS + "n_predict", GS + "max_tokens"]),
    _cmpl("max_tokens array", {"n_predict": None, "max_tokens": [1]}),
    _cmpl("stream string", {"stream": "yes"}),
    _cmpl("cache_prompt number", {"cache_prompt": 1}),
    _cmpl("ignore_eos number", {"ignore_eos": 1}),
    _cmpl("timings_per_token string", {"timings_per_token": "yes"}),
    _cmpl("return_tokens number", {"return_tokens": 1}),
    _cmpl("return_progress null is absent", {"return_progress": None}, ["tokens_predicted"]),
    _cmpl("stream_options not an object is ignored", {"stream_options": 5}, ["tokens_predicted"]),
    _cmpl("stream_options.include_usage string", {"stream_options": {"include_usage": "x"}}),
    _cmpl("n zero", {"n": 0}),
    _cmpl("n above the slots", {"n": 5}),
    _cmpl("n string", {"n": "2"}),
    _cmpl("n_cmpl negative", {"n_cmpl": -1}),
    _cmpl("n_cache_reuse negative", {"n_cache_reuse": -1}),
    _cmpl("n_keep below -1", {"n_keep": -2}),
    _cmpl("n_discard negative", {"n_discard": -1}),
    _cmpl("n_indent negative", {"n_indent": -1}),
    _cmpl("sse_ping_interval below -1", {"sse_ping_interval": -2}),
    _cmpl("t_max_predict_ms string", {"t_max_predict_ms": "x"}),
    _cmpl("t_max_predict_ms below -1", {"t_max_predict_ms": -2}),
    _cmpl("repeat_last_n negative", {"repeat_last_n": -1}),
    _cmpl("dry_allowed_length negative", {"dry_allowed_length": -1}),
    _cmpl("dry_penalty_last_n negative", {"dry_penalty_last_n": -3}),
    _cmpl("min_keep negative", {"min_keep": -1}),
    _cmpl("adaptive_decay above 0.99", {"adaptive_decay": 5}),
    _cmpl("adaptive_decay string", {"adaptive_decay": "x"}),
    _cmpl("mirostat string", {"mirostat": "x"}),
    _cmpl("top_k negative clamps", {"top_k": -4, "n_predict": 0}, [GS + "top_k"]),
    _cmpl("top_p above 1 clamps", {"top_p": 7, "n_predict": 0}, [GS + "top_p"]),
    _cmpl("min_p negative clamps", {"min_p": -1, "n_predict": 0}, [GS + "min_p"]),
    _cmpl("top_k string", {"top_k": "4"}),
    _cmpl("seed -1 wraps", {"seed": -1, "n_predict": 0}, [GS + "seed"]),
    _cmpl("seed 2^32+5 wraps", {"seed": 4294967301, "n_predict": 0}, [GS + "seed"]),
    _cmpl("seed string", {"seed": "7"}),
    _cmpl("id_slot string falls back", {"id_slot": "x"}, ["tokens_predicted"]),
    _cmpl("id_slot above the slots", {"id_slot": 7}, ["tokens_predicted"]),
    _cmpl("stop number is ignored", {"stop": 5}, ["tokens_predicted", GS + "stop"]),
    _cmpl("stop array of numbers", {"stop": [5]}),
    _cmpl("stop empty strings dropped", {"stop": ["", "zz"], "n_predict": 0}, [GS + "stop"]),
    _cmpl("lora not an array", {"lora": 5}),
    _cmpl("dry_sequence_breakers empty", {"dry_sequence_breakers": []}),
    _cmpl("reasoning_format number", {"reasoning_format": 5}),
    _cmpl("chat_format string", {"chat_format": "x"}),
    _cmpl("response_fields string falls back", {"response_fields": "x"}, ["tokens_predicted"]),
    _cmpl("response_fields picks", {"response_fields": ["content", "generation_settings/n_predict", "nope"]},
          ["keys:"]),
    # ---- /completion: the prompt
    _c("prompt missing", "/completion", GEN),
    _c("prompt null", "/completion", {"prompt": None, **GEN}),
    _c("prompt number", "/completion", {"prompt": 5, **GEN}),
    _c("prompt bool", "/completion", {"prompt": True, **GEN}),
    _c("prompt empty array", "/completion", {"prompt": [], **GEN}),
    _c("prompt empty string", "/completion", {"prompt": "", **GEN}, compare=["tokens_evaluated", "tokens_predicted"]),
    _c("prompt token out of vocab", "/completion", {"prompt": [2, 1000000], **GEN}),
    _c("prompt negative token", "/completion", {"prompt": [-3], **GEN}),
    _c("prompt float token", "/completion", {"prompt": [2, 1.5], **GEN}),
    _c("prompt object with prompt_string", "/completion", {"prompt": {"prompt_string": "hi there"}, **GEN},
       compare=["tokens_evaluated"]),
    _c("prompt object without prompt_string", "/completion", {"prompt": {"text": "hi"}, **GEN}),
    _c("prompt object with multimodal_data", "/completion",
       {"prompt": {"prompt_string": "hi", "multimodal_data": ["AAAA"]}, **GEN}),
    _c("prompt mixed ids and text", "/completion", {"prompt": [2, "hi there", 9], **GEN},
       compare=["tokens_evaluated"]),
    _c("prompt two texts", "/completion", {"prompt": ["hi", "hello there"], **GEN},
       compare=["0.index", "0.tokens_evaluated", "1.index", "1.tokens_evaluated", "1.tokens_predicted"]),
    _c("prompt text and token list", "/completion", {"prompt": ["a", [2, 3]], **GEN},
       compare=["0.tokens_evaluated", "1.tokens_evaluated", "1.index"]),
    _c("prompt two token lists", "/completion", {"prompt": [[2, 3], [2, 4, 5]], **GEN},
       compare=["0.tokens_evaluated", "1.tokens_evaluated"]),
    _c("prompt list with a bad element", "/completion", {"prompt": ["a", None], **GEN}),
    _c("prompt over the context", "/completion", {"prompt": "x " * 1500, **GEN}),
    _c("return_tokens", "/completion", {"prompt": "hi", "n_predict": 2, "temperature": 0, "return_tokens": True},
       compare=["tokens_predicted", "len:tokens"]),
    _c("tokens empty without return_tokens", "/completion", {"prompt": "hi", **GEN}, compare=["tokens"]),
    # ---- the body itself
    _c("body empty", "/completion", ""),
    _c("body not JSON", "/completion", "hello"),
    _c("body cut off", "/completion", '{"prompt": "hi", '),
    _c("body cut off in a string", "/completion", '{"prompt": "hi'),
    _c("body trailing garbage", "/completion", '{"prompt": "hi", "n_predict": 1} x'),
    _c("body single quotes", "/completion", "{'prompt': 'hi'}"),
    _c("body trailing comma", "/completion", '{"prompt": "hi", "n_predict": 1,}'),
    _c("body an array", "/completion", [1, 2]),
    _c("body a string", "/completion", '"hi"'),
    _c("body null", "/completion", "null"),
    # ---- /v1/completions
    _c("oai completion prompt missing", "/v1/completions", {"max_tokens": 1}),
    _c("oai completion max_tokens string", "/v1/completions", {"prompt": "hi", "max_tokens": "a"}),
    _c("oai completion max_tokens negative", "/v1/completions", {"prompt": "hi", "max_tokens": -7}),
    _c("oai completion two prompts", "/v1/completions", {"prompt": ["hi", "hello"], "max_tokens": 1, "temperature": 0},
       compare=["object", "len:choices", "choices.0.index", "choices.1.index", "usage.completion_tokens"]),
    _c("oai completion body empty", "/v1/completions", ""),
    # ---- /v1/chat/completions
    _c("chat messages missing", "/v1/chat/completions", {"max_tokens": 1}),
    _c("chat messages a string", "/v1/chat/completions", {"messages": "hi", "max_tokens": 1}),
    _c("chat message without content", "/v1/chat/completions", {"messages": [{"role": "user"}], "max_tokens": 1}),
    _c("chat assistant message without content", "/v1/chat/completions",
       {"messages": [*CHAT, {"role": "assistant"}], "max_tokens": 1}),
    _c("chat content a number", "/v1/chat/completions",
       {"messages": [{"role": "user", "content": 5}], "max_tokens": 1}),
    _c("chat max_tokens negative", "/v1/chat/completions", {"messages": CHAT, "max_tokens": -3}),
    _c("chat temperature string", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "temperature": "hot"}),
    _c("chat n zero", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "n": 0}),
    # b11549 parses continue_final_message strictly (common_chat_continuation_parse): the pin ignores a bad one
    _c("chat continue_final_message a word", "/v1/chat/completions",
       {"messages": CHAT, "max_tokens": 1, "temperature": 0, "continue_final_message": "yes"},
       compare=["object", "choices.0.finish_reason", "error"]),
    _c("chat continue_final_message a number", "/v1/chat/completions",
       {"messages": CHAT, "max_tokens": 1, "temperature": 0, "continue_final_message": 1},
       compare=["object", "choices.0.finish_reason", "error"]),
    _c("chat stream string", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "stream": "x"}),
    _c("chat top_logprobs without logprobs", "/v1/chat/completions",
       {"messages": CHAT, "max_tokens": 1, "top_logprobs": 2}),
    _c("chat response_format unknown type", "/v1/chat/completions",
       {"messages": CHAT, "max_tokens": 1, "response_format": {"type": "xml"}}),
    _c("chat json_schema and grammar", "/v1/chat/completions",
       {"messages": CHAT, "max_tokens": 1, "json_schema": {}, "grammar": "root ::= \"a\""}),
    _c("chat body cut off", "/v1/chat/completions", '{"messages": ['),
    # ---- /tokenize, /detokenize
    _c("tokenize content number", "/tokenize", {"content": 5}),
    _c("tokenize content null", "/tokenize", {"content": None}),
    _c("tokenize content object", "/tokenize", {"content": {"a": 1}}),
    _c("tokenize no content", "/tokenize", {}),
    _c("tokenize mixed", "/tokenize", {"content": [2, "hi there", 9]}),
    _c("tokenize out-of-vocab id", "/tokenize", {"content": [1000000]}),
    _c("tokenize list with a bad element", "/tokenize", {"content": ["a", None]}),
    _c("tokenize add_special wrong type", "/tokenize", {"content": "a", "add_special": 3}),
    _c("tokenize with_pieces wrong type", "/tokenize", {"content": "a", "with_pieces": "yes"}),
    _c("tokenize body an array", "/tokenize", [1]),
    _c("tokenize body empty", "/tokenize", ""),
    _c("tokenize body NaN", "/tokenize", '{"content": NaN}'),
    _c("detokenize tokens a string", "/detokenize", {"tokens": "abc"}),
    _c("detokenize tokens null", "/detokenize", {"tokens": None}),
    _c("detokenize token out of vocab", "/detokenize", {"tokens": [1, 1000000]}),
    _c("detokenize negative token", "/detokenize", {"tokens": [-1]}),
    _c("detokenize token a string", "/detokenize", {"tokens": ["a"]}),
    _c("detokenize float token", "/detokenize", {"tokens": [2, 1.7]}),
    _c("detokenize no tokens", "/detokenize", {}),
    _c("detokenize body empty", "/detokenize", ""),
    # ---- /slots
    _c("slots id not a number", "/slots/abc?action=erase"),
    _c("slots id too big for int", "/slots/99999999999?action=erase"),
    _c("slots id with trailing text", "/slots/1abc?action=erase", compare=["id_slot"]),
    _c("slots no action", "/slots/0"),
    _c("slots bad action", "/slots/0?action=nope"),
    _c("slots save body empty", "/slots/0?action=save", ""),
    _c("slots save filename a number", "/slots/0?action=save", {"filename": 5}),
    _c("slots save filename missing", "/slots/0?action=save", {}),
    _c("slots save filename traversal", "/slots/0?action=save", {"filename": "../x.bin"}),
    _c("slots restore missing file", "/slots/0?action=restore", {"filename": "nonexistent.bin"}),
    _c("slots negative id", "/slots/-1?action=erase", undefined=True),
    _c("slots fail_on_no_slot", "/slots?fail_on_no_slot=1", method="GET", compare="status"),
    # ---- other endpoints
    _c("props post without --props", "/props", {"x": 1}),
    _c("props", "/props", method="GET", compare=[
        "default_generation_settings.params", "default_generation_settings.n_ctx", "total_slots", "model_path",
        "model_alias", "modalities", "endpoint_slots", "endpoint_props", "endpoint_metrics", "bos_token",
        "eos_token", "is_sleeping", "ui", "keys:"]),
    _c("v1 models", "/v1/models", method="GET", compare=[
        "object", "data.0.id", "data.0.aliases", "data.0.tags", "data.0.object", "data.0.owned_by",
        "data.0.meta.n_vocab", "data.0.meta.n_ctx", "data.0.meta.n_ctx_train", "data.0.meta.n_params",
        "data.0.meta.size", "models.0.name", "models.0.capabilities", "keys:", "keys:data.0"]),
    _c("models", "/models", method="GET", compare=["object", "data.0.id", "keys:"]),
    _c("metrics", "/metrics", method="GET", compare="metrics"),
    _c("unknown path", "/nope", method="GET"),
    _c("GET on a POST route", "/completion", method="GET"),
    _c("cors preflight", "/completions", method="OPTIONS", compare="headers",
       headers={**ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}),
    _c("cors on an error", "/completion", "", compare="headers", headers=ORIGIN),
    _c("cors on health", "/health", method="GET", compare="headers", headers=ORIGIN),
]


def send(url: str, case: dict, timeout: float = 120) -> dict:
    """One request as raw bytes; the answer's status, JSON (or text) and CORS headers (`response`,
    `response_headers`; the case keeps the request's `body` and `headers`)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = None if case["body"] is None else case["body"].encode()
    headers = {"Content-Type": "application/json", **case["headers"]}
    conn.request(case["method"], case["path"], body=body, headers=headers)
    r = conn.getresponse()
    raw = r.read().decode("utf-8", "replace")
    conn.close()
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = raw
    cors = {k.lower(): v for k, v in r.getheaders() if k.lower().startswith("access-control")}
    return {"status": r.status, "response": data, "response_headers": cors}


def run_cases(url: str) -> list[dict]:
    out = []
    for case in CASES:
        got = send(url, case)
        out.append({**case, **got})
        resp = got["response"]
        body = json.dumps(resp)[:150] if not isinstance(resp, str) else resp[:80]
        print(f"{got['status']}  {case['name']:45s} {body}")
    return out


def health(url: str) -> dict:
    ok = send(url, _c("after", "/completion", {"prompt": "Hello", **GEN}))
    assert ok["response"]["tokens_predicted"] == 1, ok
    return {"health": send(url, _c("health", "/health", method="GET"))["status"], "completion": ok["status"]}


def run_fuzz(start_server, skip=frozenset()) -> list[dict]:
    """Every fuzz case on its own connection, in order; the answers as the cases compare them.
    `start_server()` gives a started LlamaServer; if it goes away mid-run (a crash, or a process
    killed from outside on a shared machine) it is started again and the case is sent again, and
    the restart is reported."""
    from tests.serve import fuzz_edge as F

    out = []
    srv = start_server()
    try:
        for case in F.cases():
            if case["name"] in skip:
                continue
            for attempt in range(3):
                host, port = srv.url.removeprefix("http://").split(":")
                try:
                    got = F.view(case, F.send(host, int(port), case))
                    break
                except ConnectionRefusedError:
                    print(f"server gone before {case['name']!r} (log {srv.log_path}); starting it again")
                    srv.__exit__(None, None, None)
                    srv = start_server()
            else:
                raise RuntimeError(f"the server keeps going away at {case['name']!r}")
            out.append({"name": case["name"], "class": case["class"], "digest": case["digest"],
                        "compare": case["compare"], "answer": got})
    finally:
        srv.__exit__(None, None, None)
    return out


def fuzz_main(slotlab: bool, missing: bool = False) -> int:
    """`missing`: keep the golden's answers to the cases whose bytes did not change and record only
    the others (each case is its own connection to a server with the same flags)."""
    from tests.serve import fuzz_edge as F

    d = tempfile.mkdtemp(prefix="bad-input-fuzz-slots-")
    command = slotlab_serve_command() if slotlab else None
    kept = {}
    if missing and FUZZ_OUT.exists():
        digests = {c["name"]: c["digest"] for c in F.cases()}
        kept = {c["name"]: c for c in json.loads(FUZZ_OUT.read_text())["cases"] if digests.get(c["name"]) == c["digest"]}
    results = run_fuzz(lambda: LlamaServer(default_model_path(), [*F.FLAGS, "--slot-save-path", d],
                                           command=command).__enter__(), skip=frozenset(kept))
    if kept:
        new = {r["name"]: r for r in results}
        print(f"kept {len(kept)} recorded answers, recorded {len(new)}")
        results = [kept.get(c["name"]) or new[c["name"]] for c in F.cases()]
    if slotlab:
        golden = {c["name"]: c for c in json.loads(FUZZ_OUT.read_text())["cases"]}
        bad = [r for r in results if golden.get(r["name"], {}).get("answer") != r["answer"]]
        for r in bad:
            g = golden.get(r["name"], {}).get("answer")
            print(f"DIFF {r['name']}\n  server:  {json.dumps(g, ensure_ascii=False)[:400]}\n"
                  f"  slotlab: {json.dumps(r['answer'], ensure_ascii=False)[:400]}")
        print(f"{len(results) - len(bad)} of {len(results)} equal")
        return 0
    FUZZ_OUT.write_text(json.dumps({"server": "llama-server (llama-cpp-python 0.3.36 vendor), --no-repack",
                                    "model": default_model_path().name, "flags": F.FLAGS, "seed": F.SEED,
                                    "cases": results}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {FUZZ_OUT}: {len(results)} cases")
    return 0


def golden_path(build: str = "pin") -> Path:
    """Where the cases' answers of a build are kept (the pin's: golden_bad_input.json)."""
    return OUT if build == "pin" else OUT.with_name(f"golden_bad_input_{build}.json")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slotlab", action="store_true", help="send the cases to `slotlab serve` (prints, writes nothing)")
    ap.add_argument("--build", default="pin", choices=("pin", "b11434", "b11549"),
                    help="record that build's llama-server (make llama-server-b11549) into golden_bad_input_BUILD.json; "
                         "with --slotlab: slotlab serve --server-build of it")
    ap.add_argument("--fuzz", action="store_true", help="the HTTP-edge fuzz (tests/serve/fuzz_edge.py)")
    ap.add_argument("--missing", action="store_true", help="with --fuzz: record only what the golden lacks")
    args = ap.parse_args()
    if args.fuzz:
        return fuzz_main(args.slotlab, args.missing)
    from bench.build_llama_server import server_binary

    d = tempfile.mkdtemp(prefix="bad-input-slots-")
    extra = [] if args.build == "pin" else ["--server-build", args.build.lstrip("b")]
    if args.slotlab:
        command = slotlab_serve_command()
    elif args.build == "pin":
        command = None
    else:
        binary = server_binary(args.build)
        if binary is None:
            raise SystemExit(f"llama-server {args.build} is not built: make llama-server-{args.build}")
        command, extra = [str(binary)], []
    with LlamaServer(default_model_path(), [*FLAGS, "--slot-save-path", d, *extra], command=command) as srv:
        results = run_cases(srv.url)
        after = health(srv.url)
    print("after:", after)
    out = golden_path(args.build)
    if args.slotlab:
        if out.exists():  # what differs from the recording
            want = {c["name"]: c for c in json.loads(out.read_text())["cases"]}
            for r in results:
                w = want.get(r["name"])
                if w is not None and (w["status"], w["response"]) != (r["status"], r["response"]):
                    print(f"DIFF {r['name']}: server {w['status']} {json.dumps(w['response'])[:200]}\n"
                          f"     slotlab {r['status']} {json.dumps(r['response'])[:200]}")
        return 0
    server = ("llama-server (llama-cpp-python 0.3.36 vendor), --no-repack" if args.build == "pin" else
              f"llama-server {args.build} (make llama-server-{args.build}), --no-repack")
    out.write_text(json.dumps({"server": server, "model": default_model_path().name, "flags": FLAGS,
                               "cases": results, "after": after}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
