"""Record a real llama-server log that shows the text around each prompt's divergence.

    SLOTLAB_LLAMA_SERVER=... python -m tests.watch.record_divergence_log
        -> tests/watch/data/divergence.{jsonl, llama-server.json, llama-server.log}

One conversation on the default model through `/v1/chat/completions` (greedy, 3 tokens a call), the
server at -lv 4 with `-np 1 --swa-full` (its `cache_n` is the divergence itself) and
`LLAMA_SERVER_SLOTS_DEBUG=1 LLAMA_SERVER_SLOTS_N_DIFF=8` (server-context.cpp 3287-3328 at b11312: the
pieces and ids of the tokens around n_past). The client changes a clock in the system prompt (call 1,
the issue's case) and then edits its first question (call 2). The `.jsonl` is the session log (what
was sent, the reply as generated), the `.llama-server.json` the server's answers and the change made.
tests/watch/test_log_divergence.py reads them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

DIR = Path(__file__).with_name("data")
FLAGS = ["-np", "1", "-c", "4096", "--swa-full", "-lv", "4"]
N_DIFF = 8


def system(clock: str) -> dict:
    return {"role": "system", "content": f"The time is {clock}. You are the assistant of a bicycle workshop. "
            "Answer in one short sentence."}


def main() -> int:
    DIR.mkdir(exist_ok=True)
    os.environ.update(LLAMA_SERVER_SLOTS_DEBUG="1", LLAMA_SERVER_SLOTS_N_DIFF=str(N_DIFF))
    lines, calls = [], []
    with LlamaServer(default_model_path(), FLAGS, log=DIR / "divergence.llama-server.log") as srv:
        def ask(messages, made=None):
            st, ans = srv.post("/v1/chat/completions", {"messages": messages, "max_tokens": 3, "temperature": 0})
            if st != 200:
                raise RuntimeError(f"{st} {ans}")
            msg = ans["choices"][0]["message"]
            reply = {"role": "assistant", "content": msg.get("content") or ""}
            lines.append({"session_id": "clock", "gap": 1.0, "messages": json.loads(json.dumps(messages)),
                          "reply": reply})
            calls.append({"cache_n": ans["timings"]["cache_n"], "prompt_n": ans["timings"]["prompt_n"],
                          "made": list(made) if made else None})
            return dict(reply)

        q0 = {"role": "user", "content": "My rear brake squeals when it rains."}
        r0 = ask([system("09:14:05"), q0])
        q1 = {"role": "user", "content": "Should I replace the pads?"}
        r1 = ask([system("09:15:41"), q0, r0, q1], made=("system_changed", 0))
        ask([system("09:15:41"), {"role": "user", "content": "My front brake squeals when it rains."}, r0, q1, r1,
             {"role": "user", "content": "How long does it take?"}], made=("message_edited", 1))
    (DIR / "divergence.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    (DIR / "divergence.llama-server.json").write_text(json.dumps(
        {"flags": FLAGS, "env": {"LLAMA_SERVER_SLOTS_DEBUG": "1", "LLAMA_SERVER_SLOTS_N_DIFF": str(N_DIFF)},
         "calls": calls}, indent=1) + "\n")
    print(calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
