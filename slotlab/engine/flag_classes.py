"""Which llama-server options slotlab does not model, and what a user is told about each.

Every option of the argument table (slotlab/engine/arg_table.py) is in exactly one class
(tests/engine/test_params_table.py checks it, so a llama.cpp bump that adds an option fails until
someone decides its class):
- modelled: parsed into a ServerParams field (slotlab/engine/params.py, FLAGS);
- SPEED: speed, hardware or log cosmetics only; accepted, one note line (what slotlab decides and
  answers is the same with or without them);
- UNMODELLED: a feature slotlab does not have; accepted so a production command line starts, and
  `slotlab serve` prints the line saying what answers `not_supported_error` or behaves otherwise;
- MODEL_SOURCE: where llama-server would download the model from; slotlab loads only a local `-m`,
  so these need `-m` (without it the model the user meant cannot be served, which is an error);
- removed: this llama.cpp parses the name and refuses it (the table's `removed` text), as slotlab does.
Rows are keyed by the option's first long name (`canonical`)."""

from __future__ import annotations

SPEED_NOTE = "only affects performance in llama-server; ignored by slotlab"

# speed / hardware / memory placement / log format: same decisions, same answers
SPEED: dict[str, str] = {name: SPEED_NOTE for name in (
    "--cpu-mask", "--cpu-range", "--cpu-strict", "--prio", "--poll", "--cpu-mask-batch", "--cpu-range-batch",
    "--cpu-strict-batch", "--prio-batch", "--poll-batch", "--perf", "--kv-offload", "--no-host", "--load-mode", "--lazy-mode", "--numa",
    "--device", "--list-devices", "--override-tensor", "--cpu-moe", "--n-cpu-moe", "--n-cpu-ffn", "--split-mode",
    "--tensor-split", "--main-gpu", "--fit", "--fit-target", "--fit-ctx", "--check-tensors", "--op-offload",
    "--rpc", "--backend-sampling", "--threads-http", "--reuse-port",
    "--spec-draft-threads", "--spec-draft-threads-batch", "--spec-draft-cpu-mask", "--spec-draft-cpu-range",
    "--spec-draft-cpu-strict", "--spec-draft-prio", "--spec-draft-poll", "--spec-draft-cpu-mask-batch",
    "--spec-draft-cpu-strict-batch", "--spec-draft-prio-batch", "--spec-draft-poll-batch", "--spec-draft-type-k",
    "--spec-draft-type-v", "--spec-draft-override-tensor", "--spec-draft-cpu-moe", "--spec-draft-n-cpu-moe",
    "--spec-draft-backend-sampling", "--spec-draft-device", "--spec-draft-ngl",
)}
SPEED["--defrag-thold"] = "deprecated and no longer necessary in llama-server; ignored by slotlab"
for _n in ("--log-disable", "--log-jsonl", "--log-colors", "--log-prefix", "--log-timestamps"):
    SPEED[_n] = "only changes how llama-server's log looks; ignored by slotlab"
for _n in ("--help", "--version", "--cache-list", "--completion-bash"):
    SPEED[_n] = "llama-server prints and exits; slotlab ignores it here (`slotlab serve --help`)"
SPEED["--special"] = "has no effect on llama-server's HTTP answers; ignored by slotlab"
SPEED["--offline"] = "slotlab never downloads; ignored"
SPEED["--hf-token"] = "slotlab never downloads; ignored"

_EMB = "embeddings are not modelled: /embedding, /embeddings and /v1/embeddings answer not_supported_error"
_MM = ("multimodal input is not modelled: image / audio / video parts in /completion and /v1/chat/completions "
       "answer not_supported_error")
_ROUTER = ("router mode is not modelled: slotlab serves the one -m model; /models/load and /models/unload answer "
           "not_supported_error")
_LORA = "LoRA adapters are not loaded: /lora-adapters and the request field `lora` answer not_supported_error"
_MODEL_OVERRIDE = "is not applied: slotlab runs the GGUF as written, so its outputs differ from llama-server's"
_SPEC = "speculative decoding other than draft-simple is not modelled: slotlab decodes without drafting for it"
_TOOLS = "the server's built-in tools, MCP proxy and agent are not modelled: their endpoints answer not_supported_error"

UNMODELLED: dict[str, str] = {
    "--embedding": _EMB, "--pooling": _EMB, "--embd-normalize": _EMB,
    "--rerank": "reranking is not modelled: /rerank, /reranking, /v1/rerank and /v1/reranking answer "
                "not_supported_error",
    "--mmproj": _MM, "--mmproj-url": _MM, "--mmproj-auto": _MM, "--mmproj-offload": _MM, "--mmproj-device": _MM,
    "--image-min-tokens": _MM, "--image-max-tokens": _MM, "--mtmd-batch-max-tokens": _MM, "--video-fps": _MM,
    "--video-timestamp-interval": _MM, "--video-ffmpeg-dir": _MM, "--media-path": _MM,
    "--lora": _LORA, "--lora-scaled": _LORA, "--lora-init-without-apply": _LORA,
    "--control-vector": "a control vector " + _MODEL_OVERRIDE,
    "--control-vector-scaled": "a control vector " + _MODEL_OVERRIDE,
    "--control-vector-layer-range": "a control vector " + _MODEL_OVERRIDE,
    "--override-kv": "a metadata override " + _MODEL_OVERRIDE,
    "--rope-scaling": "a RoPE override " + _MODEL_OVERRIDE, "--rope-scale": "a RoPE override " + _MODEL_OVERRIDE,
    "--rope-freq-base": "a RoPE override " + _MODEL_OVERRIDE, "--rope-freq-scale": "a RoPE override " + _MODEL_OVERRIDE,
    "--yarn-orig-ctx": "a YaRN override " + _MODEL_OVERRIDE, "--yarn-ext-factor": "a YaRN override " + _MODEL_OVERRIDE,
    "--yarn-attn-factor": "a YaRN override " + _MODEL_OVERRIDE,
    "--yarn-beta-slow": "a YaRN override " + _MODEL_OVERRIDE, "--yarn-beta-fast": "a YaRN override " + _MODEL_OVERRIDE,
    "--context-shift": "context shift is not modelled: a generation that fills the slot's context stops there "
                       "(as with --no-context-shift) instead of discarding old tokens",
    "--models-max": _ROUTER, "--models-autoload": _ROUTER,
    "--spm-infill": "/infill is not modelled (it answers not_supported_error)",
    "--lookup-cache-static": _SPEC, "--lookup-cache-dynamic": _SPEC, "--spec-default": _SPEC,
    "--spec-synth-len": _SPEC, "--spec-synth-rates": _SPEC,
    "--spec-ngram-mod-n-min": _SPEC, "--spec-ngram-mod-n-max": _SPEC, "--spec-ngram-mod-n-match": _SPEC,
    "--spec-ngram-simple-size-n": _SPEC, "--spec-ngram-simple-size-m": _SPEC, "--spec-ngram-simple-min-hits": _SPEC,
    "--spec-ngram-map-k-size-n": _SPEC, "--spec-ngram-map-k-size-m": _SPEC, "--spec-ngram-map-k-min-hits": _SPEC,
    "--spec-ngram-map-k4v-size-n": _SPEC, "--spec-ngram-map-k4v-size-m": _SPEC,
    "--spec-ngram-map-k4v-min-hits": _SPEC,
    "--spec-draft-p-split": "the draft's p-split is not modelled: slotlab's draft-simple drafts greedily",
    "--spec-draft-p-min": "the draft's p-min is not modelled: slotlab's draft-simple drafts greedily",
    "--path": "static files are not served: paths outside the API answer 404",
    "--api-prefix": "the API prefix is not applied: slotlab serves its endpoints at the root",
    "--ssl-key-file": "TLS is not modelled: slotlab serves plain HTTP",
    "--ssl-cert-file": "TLS is not modelled: slotlab serves plain HTTP",
    "--ui-config": "the web UI is not served (slotlab has none)", "--ui-config-file": "the web UI is not served "
                                                                                      "(slotlab has none)",
    "--ui-mcp-proxy": _TOOLS, "--tools": _TOOLS, "--tools-runtime": _TOOLS, "--mcp-servers-config": _TOOLS,
    "--mcp-servers-json": _TOOLS, "--agent": _TOOLS,
    "--log-prompts-dir": "prompts are not logged to a directory",
}

# where llama-server would fetch the model (or run a router over a folder): slotlab needs a local -m
MODEL_SOURCE: dict[str, str] = {name: "slotlab never downloads a model" for name in (
    "--model-url", "--docker-repo", "--hf-repo", "--hf-file", "--spec-draft-hf",
    "--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default", "--fim-qwen-7b-default",
    "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default", "--gpt-oss-20b-default",
    "--gpt-oss-120b-default", "--vision-gemma-4b-default", "--vision-gemma-12b-default",
)}
MODEL_SOURCE["--models-dir"] = MODEL_SOURCE["--models-preset"] = _ROUTER
