"""Record the real llama-server's answers to the sampling features of the HTTP contract: greedy
generations with `n_probs` / `post_sampling_probs` / OpenAI `logprobs`, `logit_bias` in its array and
object forms, GBNF `grammar`, `json_schema` and `response_format`, `n` > 1, and their errors; plus
the GBNF the server converts each JSON schema to (from its debug log).

    python -m tests.serve.record_sampling     -> tests/serve/golden_sampling.json

tests/serve/test_sampling.py sends the same REQUESTS to `slotlab serve` and compares."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

OUT = Path(__file__).with_name("golden_sampling.json")
FLAGS = ["-c", "2048", "-np", "2"]
PROMPT = "The capital of France is"
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
    ("logit_bias_str", "/completion", {"prompt": PROMPT, "n_predict": 6, "logit_bias": {" Paris": -100}, **G}),
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


def run_all(srv) -> list[dict]:
    """Send REQUESTS (the first one's first token resolves @GREEDY0); status and body each."""
    out = []
    greedy0 = None
    for name, path, body in REQUESTS:
        if greedy0 is not None:
            body = resolve(body, greedy0)
        status, res = srv.post(path, body)
        if greedy0 is None:
            greedy0 = res["completion_probabilities"][0]["id"]
        out.append({"name": name, "path": path, "request": body, "status": status, "response": res})
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
    with LlamaServer(default_model_path(), FLAGS) as srv:
        results = run_all(srv)
    grammars = record_grammars()
    OUT.write_text(json.dumps({"flags": FLAGS, "results": results, "grammars": grammars}, indent=1,
                              ensure_ascii=False) + "\n")
    for r in results:
        print(r["name"], r["status"], json.dumps(r["response"])[:160])
    for g in grammars:
        print(json.dumps(g["schema"]), repr(g["grammar"])[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
