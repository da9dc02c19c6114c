"""Record what the real llama-server reports as its request defaults for a few command lines, so
tests/engine/test_params_table.py can check slotlab.serve.defaults.sampling_defaults() against it without the
binary.

    .venv/bin/python -m tests.engine.record_params_props    # needs `make llama-server`

Writes tests/engine/data/params_props.json: for each command line, the flags and /props's
`default_generation_settings.params` (the task defaults the server built from its flags)."""

from __future__ import annotations

import json
from pathlib import Path

from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer

OUT = Path(__file__).with_name("data") / "params_props.json"

CASES = [
    [],
    ["--temp", "0.7", "--top-k", "20", "--top-p", "0.8", "--min-p", "0.1", "--seed", "42", "-n", "64",
     "--keep", "5", "--repeat-last-n", "32", "--repeat-penalty", "1.1", "--presence-penalty", "0.5",
     "--frequency-penalty", "0.25", "--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3",
     "--dry-penalty-last-n", "128", "--dry-sequence-breaker", "\\n", "--dry-sequence-breaker", "###",
     "--typical", "0.9", "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--top-nsigma", "1.5",
     "--dynatemp-range", "0.3", "--dynatemp-exp", "1.2", "--mirostat", "2", "--mirostat-lr", "0.2",
     "--mirostat-ent", "4", "--samplers", "top_k;temperature;min-p", "-r", "User:", "--ignore-eos",
     "-l", "15+1.5", "--reasoning-format", "none", "--cache-reuse", "256", "--no-cache-prompt",
     "--sse-ping-interval", "10", "--adaptive-target", "0.5", "--adaptive-decay", "0.5"],
    ["--seed", "-1", "--temp", "-2", "--sampler-seq", "kyx", "--dry-base", "0.5"],
]


def main() -> None:
    out = []
    for flags in CASES:
        with LlamaServer(default_model_path(), ["-np", "1", "-c", "1024", *flags]) as srv:
            status, props = srv.get("/props")
            assert status == 200, props
        out.append({"flags": flags, "params": props["default_generation_settings"]["params"]})
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
