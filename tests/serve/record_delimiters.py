"""Record the message delimiters the real llama-server derives for chat templates, and where it then
takes checkpoints in a chat on the default model (Gemma 3 270M: SWA, so the server checkpoints).

    SLOTLAB_LLAMA_SERVER=... python -m tests.serve.record_delimiters [NAME...]
        -> tests/serve/golden_delimiters.json

Per configuration the server runs with `-lv 5` (its debug lines: the autoparser logs
`user_msg_start: ...` and `assistant_msg_start: ...`, a specialized parser `Using specialized template:
...`), `-np 1` and `--checkpoint-min-step` 0 (every user-message start more than 0 tokens past the last
checkpoint is one, so each delimiter match shows) or the default. One chat of four user turns goes to
`/v1/chat/completions` (1 token); kept: the prompt the server rendered (`/apply-template`), the two
logged starts (autoparser only), the specialized parser's name, and the `n_tokens` of every
`created context checkpoint` line. tests/serve/test_delimiters.py compares slotlab's delimiters and
the checkpoints its engine takes for the same prompt."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

HERE = Path(__file__).parent
OUT = HERE / "golden_delimiters.json"
TEMPLATES = HERE.parents[0] / "llamacpp" / "vendor" / "models" / "templates"

CHAT = [{"role": "system", "content": "You are the assistant of a bicycle workshop. Answer in one short sentence."},
        {"role": "user", "content": "My rear brake squeals when it rains."},
        {"role": "assistant", "content": "Clean the rim and the pads."},
        {"role": "user", "content": "Should I replace the pads?"},
        {"role": "assistant", "content": "Only if they are worn."},
        {"role": "user", "content": "How long does a pad change take?"},
        {"role": "assistant", "content": "About twenty minutes."},
        {"role": "user", "content": "Do you have pads for a 2019 city bike?"}]

# name -> (template file under tests/llamacpp/vendor/models/templates, or None: the model's own (none: ChatML),
#          extra flags)
CMS0 = ["--checkpoint-min-step", "0"]
CONFIGS = {
    "chatml": (None, CMS0),
    "chatml_default_cms": (None, []),
    "gemma2": ("google-gemma-2-2b-it.jinja", CMS0),
    "gemma2_default_cms": ("google-gemma-2-2b-it.jinja", []),
    "qwen25": ("Qwen-Qwen2.5-7B-Instruct.jinja", CMS0),
    "llama3_1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", CMS0),
    "phi3_5": ("microsoft-Phi-3.5-mini-instruct.jinja", CMS0),
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", CMS0),
    "command_r_plus": ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", CMS0),
    "gemma4": ("google-gemma-4-31B-it.jinja", CMS0),
    "qwen3_coder": ("Qwen3-Coder.jinja", CMS0),
    "devstral": ("unsloth-mistral-Devstral-Small-2507.jinja", CMS0),
    "legacy": (None, ["--no-jinja", *CMS0]),
}

_START = re.compile(r"\b(user|assistant)_msg_start: (.*)$")
_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")  # a log line's timestamp and level
_SPECIAL = re.compile(r"Using specialized template: (.*)$")
_CKPT = re.compile(r"created context checkpoint \d+ of \d+ \(pos_min = -?\d+, pos_max = -?\d+, n_tokens = (\d+)")


def record(name: str) -> dict:
    tmpl, extra = CONFIGS[name]
    flags = ["-np", "1", "-c", "4096", "-lv", "5", *extra]
    if tmpl:
        flags = [*flags, "--jinja", "--chat-template-file", str(TEMPLATES / tmpl)]
    log = Path(f"/tmp/slotlab-delims-{name}.log")
    with LlamaServer(default_model_path(), flags, log=log) as srv:
        now = time.time()  # a template may print the date (Llama 3.1): the test renders at this time
        st, ap = srv.post("/apply-template", {"messages": CHAT})
        assert st == 200, ap
        st, ans = srv.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "temperature": 0})
        assert st == 200, ans
    starts, special, ckpts, key = {}, None, [], None
    for line in log.read_text(errors="replace").splitlines():
        if key is not None and not _LINE.match(line):  # a start with a newline in it goes on on the next line
            starts[key] += "\n" + line
            continue
        key = None
        if m := _START.search(line):
            # the last analysis wins: each chat request runs its own (the one its delimiters come from); the
            # one at start-up can differ (Phi 3.5, Command R+ here)
            key = m.group(1)
            starts[key] = m.group(2)
        elif (m := _SPECIAL.search(line)) and special is None:
            special = m.group(1).strip()
        elif m := _CKPT.search(line):
            ckpts.append(int(m.group(1)))
    log.unlink()
    t = ans["timings"]
    print(f"{name:20s} starts {starts} special {special} checkpoints {ckpts} prompt_n {t['prompt_n']}")
    return {"template_file": tmpl, "flags": extra, "time": now, "prompt": ap["prompt"], "user_msg_start": starts.get("user"),
            "assistant_msg_start": starts.get("assistant"), "specialized": special, "checkpoints": ckpts,
            "cache_n": t["cache_n"], "prompt_n": t["prompt_n"]}


def main(argv: list[str]) -> int:
    names = argv or list(CONFIGS)
    doc = json.loads(OUT.read_text()) if OUT.exists() else {}
    doc.setdefault("server", "llama-server b11312 (llama-cpp-python 0.3.36 vendor), --no-repack -t 2 -np 1 -c 4096 -lv 5")
    doc.setdefault("model", default_model_path().name)
    doc["chat"] = CHAT
    doc.setdefault("configs", {})
    for n in names:
        doc["configs"][n] = record(n)
        OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
