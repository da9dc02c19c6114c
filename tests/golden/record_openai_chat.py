"""Record a multi-turn chat through the official `openai` client against the real llama-server:
per turn `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`.

    python -m tests.golden.record_openai_chat     -> tests/golden/openai_chat.llama-server.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

OUT = Path(__file__).with_name("openai_chat.llama-server.json")
FLAGS = ["-c", "8192"]  # the server's defaults otherwise (4 slots, unified, SWA with checkpoints)
TURNS = ["Hello! I am planning a trip to Lisbon in May.", "What should I pack?",
         "Is public transport good there?", "Thanks. One more: any day trips you would suggest?"]


def run_chat(base_url: str, api_key: str = "none") -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key)
    messages = [{"role": "system", "content": "You are a concise travel assistant. " +
                 " ".join(f"Guideline {i}: be specific about item {i}." for i in range(30))}]
    out = []
    for i, user in enumerate(TURNS):
        messages.append({"role": "user", "content": user})
        r = client.chat.completions.create(model="gemma", messages=messages, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True})
        # fixed assistant text keeps the next prompt independent of what the model wrote
        messages.append({"role": "assistant", "content": f"Answer number {i}."})
        out.append({"prompt_tokens": r.usage.prompt_tokens,
                    "cached_tokens": r.usage.prompt_tokens_details.cached_tokens,
                    "completion_tokens": r.usage.completion_tokens})
    return out


def main() -> int:
    with LlamaServer(default_model_path(), FLAGS) as srv:
        turns = run_chat(srv.url + "/v1")
    OUT.write_text(json.dumps({"flags": FLAGS, "turns": turns}, indent=1) + "\n")
    print(turns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
