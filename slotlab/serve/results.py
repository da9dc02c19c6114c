"""What a finished task answers: llama-server's final response JSON for each API kind, its error
and usage, built from the task's result (server_task_result_cmpl_final::to_json and its kin).

`Api` (app.py) answers a request that is not streamed with these, and the `Streamer` (stream.py)
ends a stream with the same pieces, so the two can never disagree on a field. Nothing here touches
the engine's state: it reads the task, the model (texts, end-of-generation tokens) and the flags."""

from __future__ import annotations

import math
import time

import numpy as np

from slotlab.serve import anthropic as A
from slotlab.serve import errors as E
from slotlab.serve import info
from slotlab.serve import responses as R
from slotlab.serve import sampling as smp
from slotlab.serve.stream import TextSender


class Results:
    def __init__(self, engine):
        self.engine = engine
        self.p = engine.params
        self._eog: list[int] | None = None  # the model's end-of-generation tokens (ignore_eos biases)

    def task_error(self, task):
        """server_task_result_error::to_json: the context-size error also names both sizes."""
        e = task.error
        extra = {}
        if e.type == "exceed_context_size_error":
            extra = {"n_prompt_tokens": task.n_tokens, "n_ctx": self.engine.n_ctx_slot}
        return E.error(e.code, e.message, e.type, **extra)

    def text(self, task) -> TextSender:
        """The generated text as the server builds it token by token (process_token: pieces without
        special tokens, cut at a stop string), with its stopping_word and has_new_line."""
        if getattr(task, "text", None) is None:
            task.text = TextSender.replay(self.engine.model, task.result["tokens"], task.values.get("stop") or ())
        return task.text

    def final_json(self, task) -> dict:
        r = task.result
        text = self.text(task)
        stop_type = r["stop_type"]
        v = getattr(task, "values", None) or {}
        out = {
            "index": task.index, "content": text.content,
            "tokens": r["tokens"] if v.get("return_tokens") else [], "id_slot": r["id_slot"], "stop": True,
            "model": self.model_name(), "tokens_predicted": r["tokens_predicted"],
            "tokens_evaluated": r["tokens_evaluated"],
            "generation_settings": info.finite(info.task_params_json({**v, "logit_bias": self.logit_bias_json(task)})),
            "prompt": self.engine.model.detokenize(task.tokens), "has_new_line": text.has_new_line,
            "truncated": r["truncated"], "stop_type": stop_type, "stopping_word": text.stopping_word, "tokens_cached": r["tokens_cached"],
            "timings": r["timings"],
        }
        self.add_probs(out, task, "completion", stream=False)
        if v.get("response_fields"):
            return info.json_nested(v["response_fields"], out)
        return out

    def logit_bias_json(self, task) -> list[dict]:
        """task_params::format_logit_bias: the request's biases, then (ignore_eos) every end-of-generation
        token at -inf (the ignore_eos field handler appends logit_bias_eog), as float32 values."""
        sp = task.params.sampling
        lb = [(int(t), float(b)) for t, b in (sp.logit_bias if sp is not None else ())]
        if getattr(task, "values", {}).get("ignore_eos"):
            if self._eog is None:
                m = self.engine.model
                self._eog = [t for t in range(m.n_vocab) if m.is_eog(t)]
            lb += [(t, -math.inf) for t in self._eog]
        return [{"bias": float(np.float32(b)), "token": t} for t, b in lb]

    def add_probs(self, out: dict, task, kind: str, stream: bool) -> None:
        """completion_probabilities / OpenAI logprobs of a final response (not when streamed)."""
        sp = task.params.sampling
        if stream or sp is None or sp.n_probs <= 0 or task.result is None:
            return
        probs = smp.probs_for_result(self.engine.model, task, stream=stream)
        if not probs:
            return
        js = smp.probs_json(self.engine.model, probs, sp.post_sampling_probs)
        if kind == "completion":
            out["completion_probabilities"] = js
        else:
            out["choices"][0]["logprobs"] = {"content": js}

    def model_name(self) -> str:
        """meta.model_name: the first --alias, else the model path as given."""
        aliases = self.aliases()
        return aliases[0] if aliases else str(self.engine.model.path)

    def aliases(self) -> list[str]:
        return sorted(set(getattr(self.p, "model_alias", ()) or ()))

    def usage(self, r: dict) -> dict:
        return {"completion_tokens": r["tokens_predicted"], "prompt_tokens": r["tokens_evaluated"],
                "total_tokens": r["tokens_predicted"] + r["tokens_evaluated"],
                "prompt_tokens_details": {"cached_tokens": r["timings"]["cache_n"]}}

    def shape_final(self, task, kind: str, cid: str | None) -> dict:
        """server_task_result_cmpl_final::to_json (not streamed; slotlab.serve.stream streams). `cid`: the
        request's gen_chatcmplid, made once in `_run` for every kind but "completion" (choices share it)."""
        r = task.result
        if kind == "completion":
            return self.final_json(task)
        if kind == "responses":
            st = R.new_state()
            return R.final_json(st["resp_id"], st["msg_id"], self.model_name(), r, self.text(task).content,
                                int(time.time()))
        if kind == "anthropic":
            text = self.text(task)
            return A.final_json(cid, self.model_name(), r, text.content, text.stopping_word)
        finish = "length" if r["stop_type"] == "limit" else "stop"
        if kind == "oai_text":
            choice = {"text": self.text(task).content, "index": task.index, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        else:
            choice = {"finish_reason": finish, "index": task.index,
                      "message": {"role": "assistant", "content": self.text(task).content}}
            obj = "chat.completion"
        out = {"choices": [choice], "created": int(time.time()), "model": self.model_name(),
               "system_fingerprint": info.BUILD_INFO, "object": obj, "usage": self.usage(r), "id": cid}
        if task.values.get("verbose"):  # "extra fields for debugging purposes"
            out["__verbose"] = self.final_json(task)
        out["timings"] = r["timings"]
        self.add_probs(out, task, kind, stream=False)
        return out
