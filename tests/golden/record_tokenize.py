"""Record how the real llama-server tokenizes a set of prompts (ids and `tokens_evaluated`).

    python -m tests.golden.record_tokenize      # needs `make llama-server`
writes tests/golden/tokenize.llama-server.json, which tests/llama/test_tokenize.py compares with."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

OUT = Path(__file__).with_name("tokenize.llama-server.json")

PROMPTS = [
    "Hello",
    "You are a terse assistant. User: name three rivers in Europe.",
    " leading space and trailing space ",
    "line one\nline two\n\n\nline five\ttab",
    "<start_of_turn>user\nWhat is a KV cache?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>an explicit bos already",
    "Unicode: naïve café, 日本語のテキスト, emoji 🦙🧪, Ελληνικά, العربية",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # code\n",
    "1234567890 3.14159 -42 1e-9 0xdeadbeef",
    "   ",
    "a" * 300,
    "The llama " * 120,
    "<end_of_turn><eos></s> special-looking text <unused0>",
]


def main() -> int:
    model = default_model_path()
    records = []
    with LlamaServer(model, ["-np", "1", "-c", "4096"]) as srv:
        for p in PROMPTS:
            st, tok = srv.post("/tokenize", {"content": p, "add_special": True, "parse_special": True})
            assert st == 200, tok
            st, comp = srv.post("/completion", {"prompt": p, "n_predict": 1, "temperature": 0, "cache_prompt": False})
            assert st == 200, comp
            records.append({"prompt": p, "tokens": tok["tokens"], "tokens_evaluated": comp["tokens_evaluated"]})
            print(f"{comp['tokens_evaluated']:5d} tokens  {p[:50]!r}")
    OUT.write_text(json.dumps({"server": "llama-server (llama-cpp-python 0.3.36 vendor), --no-repack",
                               "model": model.name, "records": records}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
