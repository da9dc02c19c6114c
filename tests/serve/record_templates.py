"""Record how the real llama-server renders chat templates: `/apply-template`, the prompt's tokens
(`/tokenize` with the chat path's add_special/parse_special) and `tokens_evaluated` of a 1-token chat
completion, for the real Jinja templates of several model families and for the template flags.

    python -m tests.serve.record_templates             # needs `make llama-server`
    python -m tests.serve.record_templates qwen3 phi   # only some configurations

Each family's template (llama.cpp's own copies under models/templates/) is written into a copy of the
default model's GGUF (`tokenizer.chat_template`, tests/serve/gguf_with_template.py) in build/, the real
server is started on it, and the answers go to tests/serve/golden_templates/<name>.json, which
tests/serve/test_chat_templates.py renders again with slotlab and compares, without a server."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.build_llama_server import source_dir
from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer
from tests.serve.gguf_with_template import write_with_template

HERE = Path(__file__).parent
OUT = HERE / "golden_templates"
BUILD = HERE.parents[1] / "build" / "template-ggufs"

SYS = {"role": "system", "content": "You are a terse assistant."}
CONVERSATIONS = {
    "system_user": {"messages": [SYS, {"role": "user", "content": "Name three rivers in Europe."}]},
    "user_only": {"messages": [{"role": "user", "content": "Hello there!"}]},
    "multi_turn": {"messages": [SYS, {"role": "user", "content": "What is 2+2?"},
                                {"role": "assistant", "content": "4."},
                                {"role": "user", "content": "  And times three?\n"}]},
    "prefill": {"messages": [{"role": "user", "content": "Write a haiku about llamas."},
                             {"role": "assistant", "content": "Woolly and calm"}]},
    "no_generation_prompt": {"messages": [{"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": "Hello! How can I help?"}],
                             "add_generation_prompt": False, "continue_final_message": False},
    "developer_unicode": {"messages": [{"role": "developer", "content": "Réponds en français. 日本語も OK"},
                                       {"role": "user", "content": "Bonjour 🦙"}]},
    "thinking_off": {"messages": [{"role": "user", "content": "Quick: capital of France?"}],
                     "chat_template_kwargs": {"enable_thinking": False}},
    "reasoning_history": {"messages": [{"role": "user", "content": "What is 3*3?"},
                                       {"role": "assistant", "content": "9",
                                        "reasoning_content": "Three times three is nine."},
                                       {"role": "user", "content": "And 4*4?"}]},
    "with_tools": {"messages": [SYS, {"role": "user", "content": "Weather in Paris?"}],
                   "tools": [{"type": "function", "function": {
                       "name": "get_weather", "description": "Get the current weather for a city",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                                       "unit": {"enum": ["C", "F"]}},
                                      "required": ["city"]}}}]},
    # requests the server refuses (status and error text recorded)
    "error_two_assistants": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A"},
                                          {"role": "assistant", "content": "B"}]},
    "error_missing_content": {"messages": [{"role": "user"}]},
    "error_continue_with_generation_prompt": {"messages": [{"role": "user", "content": "Hi"}],
                                              "continue_final_message": True},
    "error_bad_content_type": {"messages": [{"role": "user", "content": 5}]},
}

# name -> (template file under models/templates/, or None for the model's own (none: ChatML), extra flags)
CONFIGS = {
    "default_chatml": (None, ["--jinja"]),
    "gemma2": ("google-gemma-2-2b-it.jinja", ["--jinja"]),
    "qwen2_5": ("Qwen-Qwen2.5-7B-Instruct.jinja", ["--jinja"]),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", ["--jinja"]),
    "qwen3_reasoning_off": ("Qwen-Qwen3-0.6B.jinja", ["--jinja", "--reasoning", "off"]),
    "qwen3_kwargs": ("Qwen-Qwen3-0.6B.jinja", ["--jinja", "--chat-template-kwargs", '{"enable_thinking": false}']),
    "llama3_1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", ["--jinja"]),
    "llama3_2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", ["--jinja"]),
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", ["--jinja"]),
    "mistral_small_3_2": ("Mistral-Small-3.2-24B-Instruct-2506.jinja", ["--jinja"]),
    "phi3_5": ("microsoft-Phi-3.5-mini-instruct.jinja", ["--jinja"]),
    "deepseek_r1_qwen": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ["--jinja"]),
    "gpt_oss": ("openai-gpt-oss-120b.jinja", ["--jinja"]),
    # the template flags, on the default model (no template of its own)
    "flag_chatml": (None, ["--jinja", "--chat-template", "chatml"]),
    "flag_jinja_llama3": (None, ["--jinja", "--chat-template", "llama3"]),
    "flag_file_phi3_5": (None, ["--jinja", "--chat-template-file", "@microsoft-Phi-3.5-mini-instruct.jinja"]),
    "legacy_default": (None, ["--no-jinja"]),
    "legacy_llama3": (None, ["--no-jinja", "--chat-template", "llama3"]),
    "legacy_gemma": (None, ["--no-jinja", "--chat-template", "gemma"]),
    "legacy_mistral_v7": (None, ["--no-jinja", "--chat-template", "mistral-v7"]),
    "legacy_phi3": (None, ["--no-jinja", "--chat-template", "phi3"]),
    "legacy_from_gguf_llama3_1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", ["--no-jinja"]),
}


def record(name: str) -> dict:
    tmpl_file, flags = CONFIGS[name]
    templates = source_dir() / "models" / "templates"
    # the template texts go into the recording: CI has no llama.cpp tree to read them from
    texts = {f[1:]: (templates / f[1:]).read_text(encoding="utf-8") for f in flags if f.startswith("@")}
    flags = [str(templates / f[1:]) if f.startswith("@") else f for f in flags]
    model = default_model_path()
    copy = None
    gguf_template = None
    if tmpl_file is not None:
        gguf_template = (templates / tmpl_file).read_text(encoding="utf-8")
        copy = write_with_template(model, BUILD / f"{name}.gguf", gguf_template)
    cases = []
    try:
        with LlamaServer(copy or model, ["-np", "1", "-c", "4096", *flags]) as srv:
            for conv, body in CONVERSATIONS.items():
                now = time.time()
                st, out = srv.post("/apply-template", body)
                case = {"conversation": conv, "request": body, "time": now, "status": st}
                if st != 200:
                    case["error"] = out
                    cases.append(case)
                    print(f"  {name:22s} {conv:22s} -> {st} {out}")
                    continue
                prompt = out["prompt"]
                st, tok = srv.post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
                assert st == 200, tok
                st, comp = srv.post("/v1/chat/completions", {**body, "max_tokens": 1, "temperature": 0,
                                                             "cache_prompt": False})
                case.update(prompt=prompt, tokens=tok["tokens"],
                            prompt_tokens=comp["usage"]["prompt_tokens"] if st == 200 else None)
                cases.append(case)
                print(f"  {name:22s} {conv:22s} {len(tok['tokens']):4d} tokens, chat usage {case['prompt_tokens']}")
            st, props = srv.get("/props")
    finally:
        if copy is not None:
            copy.unlink(missing_ok=True)
    return {"server": "llama-server (llama-cpp-python 0.3.36 vendor), --no-repack -t 2 -np 1 -c 4096",
            "template_file": tmpl_file, "gguf_template": gguf_template, "flags": CONFIGS[name][1],
            "flag_files": texts, "model": model.name,
            "props_chat_template": props.get("chat_template"), "cases": cases}


def main(argv: list[str]) -> int:
    names = argv or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"unknown configuration(s): {unknown}; known: {list(CONFIGS)}", file=sys.stderr)
        return 2
    OUT.mkdir(exist_ok=True)
    for name in names:
        rec = record(name)
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
