"""llama-server's HTTP API over a live slotlab engine (Starlette on uvicorn).

Request fields, response JSON, status codes and error texts follow the server for everything slotlab
models (spec 5.1, 8); fields it does not model get the server's `not_supported_error` (501) instead
of being ignored. The engine runs in its background thread; handlers only submit tasks and wait on
them, and a client that goes away cancels its task (its slot is released, as the server does)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from slotlab.engine.slot_actions import check_slot_action
from slotlab.serve.chat import ChatTemplate

SUPPORTED = {"prompt", "n_predict", "max_tokens", "temperature", "seed", "ignore_eos", "cache_prompt", "id_slot",
             "n_cache_reuse", "stream", "return_progress", "message_delimiters", "stop", "model", "messages", "n",
             "stream_options", "user", "top_k", "top_p", "min_p"}
# fields of the server's API that slotlab does not model: an error, never silence
NOT_SUPPORTED = {"grammar", "json_schema", "response_format", "lora", "n_probs", "logprobs", "top_logprobs",
                 "image_data", "multimodal_data", "logit_bias", "mirostat", "mirostat_tau", "mirostat_eta",
                 "dry_multiplier", "xtc_probability", "typical_p", "repeat_penalty", "presence_penalty",
                 "frequency_penalty", "tools", "tool_choice", "n_keep", "n_discard", "samplers", "t_max_predict_ms",
                 "n_indent", "post_sampling_probs", "suffix", "input_extra", "echo", "best_of"}


def error(code: int, message: str, type_: str, **extra) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "type": type_, **extra}}, status_code=code)


def not_supported(what: str) -> JSONResponse:
    return error(501, f"{what} is not supported by slotlab (it models llama-server's slots and caches)",
                 "not_supported_error")


class Api:
    def __init__(self, engine):
        self.engine = engine
        self.p = engine.params
        self.chat = ChatTemplate(engine.model)
        self.t0 = time.time()

    # ---------------------------------------------------------------- helpers

    def _check_fields(self, body: dict):
        bad = sorted(k for k in body if k in NOT_SUPPORTED and body[k] not in (None, False, [], {}))
        if bad:
            return not_supported(f"the request field \"{bad[0]}\"")
        return None

    def _prompt_tokens(self, prompt):
        """A text prompt, token ids, or the server's mixed array: the engine's one tokenizing rule."""
        return self.engine.tokenize(prompt)

    async def _await(self, request: Request, task) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        task.add_done_callback(lambda t: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(t)))
        while not fut.done():
            try:
                await asyncio.wait_for(asyncio.shield(fut), 0.2)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    await run_in_threadpool(self.engine.cancel, task)
                    await fut
                    return

    def _submit(self, body: dict, tokens, on_token=None):
        n_predict = body.get("n_predict", body.get("max_tokens", -1))
        if n_predict is None:
            n_predict = -1
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        return self.engine.submit(
            tokens, n_predict=int(n_predict), id_slot=int(body.get("id_slot", -1)),
            cache_prompt=body.get("cache_prompt"), n_cache_reuse=body.get("n_cache_reuse"),
            temperature=float(body.get("temperature", 0.8)), seed=int(body.get("seed", 0xFFFFFFFF)),
            ignore_eos=bool(body.get("ignore_eos", False)), message_delimiters=body.get("message_delimiters"),
            stop=stop, on_token=on_token)

    @staticmethod
    def _task_error(task) -> JSONResponse:
        e = task.error
        return error(e.code, e.message, e.type)

    def _final_json(self, task) -> dict:
        r = task.result
        stop_type = r["stop_type"]
        return {
            "index": 0, "content": r["content"], "tokens": [], "id_slot": r["id_slot"], "stop": True,
            "model": self.model_name(), "tokens_predicted": r["tokens_predicted"],
            "tokens_evaluated": r["tokens_evaluated"], "generation_settings": {"n_predict": task.params.n_predict,
                                                                                "temperature": task.params.temperature,
                                                                                "seed": task.params.seed},
            "prompt": self.engine.model.detokenize(task.tokens), "has_new_line": "\n" in r["content"],
            "truncated": r["truncated"], "stop_type": stop_type, "stopping_word": "", "tokens_cached": r["tokens_cached"],
            "timings": r["timings"],
        }

    def model_name(self) -> str:
        return self.engine.model.path.name

    # ---------------------------------------------------------------- simple endpoints

    async def health(self, request: Request):
        return JSONResponse({"status": "ok"})

    async def props(self, request: Request):
        e = self.engine
        return JSONResponse({
            "default_generation_settings": {"id": 0, "n_ctx": e.n_ctx_slot, "speculative": e.dctx is not None,
                                            "is_processing": False, "params": {"n_predict": self.p.n_predict}},
            "total_slots": len(e.slots), "model_path": str(e.model.path), "chat_template": self.chat.source,
            "modalities": {"vision": False, "audio": False}, "build_info": "slotlab on llama-cpp-python 0.3.36",
            "is_sleeping": False,
        })

    async def slots(self, request: Request):
        if not self.p.slots_endpoint:
            return error(501, "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error")
        data = await run_in_threadpool(self.engine.slots_json)  # the event loop keeps serving meanwhile
        if request.query_params.get("fail_on_no_slot") and not any(not s["is_processing"] for s in data):
            return error(503, "no slot available", "unavailable_error")
        return JSONResponse(data)

    async def slot_action(self, request: Request):
        err = check_slot_action(self.p.slot_save_path, "erase")  # is the feature on (501)
        if err is not None:
            return error(err.code, err.message, err.type)
        raw = request.path_params["id_slot"]
        digits = raw.lstrip("+-")
        n = len(raw) - len(digits)
        while n < len(raw) and raw[n].isdigit():
            n += 1
        if n == len(raw) - len(digits) or not raw[len(raw) - len(digits):n]:
            return error(400, "Invalid slot ID", "invalid_request_error")
        id_slot = int(raw[:n])  # std::stoi: leading digits ("1abc" -> 1)
        action = request.query_params.get("action", "")
        err = check_slot_action(self.p.slot_save_path, action, check_filename=False)
        if err is not None:
            return error(err.code, err.message, err.type)
        filename = None
        if action != "erase":
            try:
                body = json.loads(await request.body() or b"null")
                filename = body["filename"]
            except (ValueError, KeyError, TypeError) as ex:
                return error(500, f"[json.exception] {ex}", "server_error")
        task = self.engine.slot_action(action, id_slot, filename)
        await self._await(request, task)
        if task.error is not None:
            return self._task_error(task)
        return JSONResponse(task.result)

    async def tokenize(self, request: Request):
        body = await request.json()
        content = body.get("content")
        if content is None:
            return JSONResponse({"tokens": []})
        add_special = bool(body.get("add_special", False))
        parse_special = bool(body.get("parse_special", True))
        m = self.engine.model
        toks = m.tokenize(content, add_special=add_special, parse_special=parse_special).tolist() \
            if isinstance(content, str) else list(content)
        if body.get("with_pieces"):
            out = []
            for t in toks:
                piece = m.token_to_piece(t)
                try:
                    out.append({"id": t, "piece": piece.decode("utf-8")})
                except UnicodeDecodeError:
                    out.append({"id": t, "piece": list(piece)})
            return JSONResponse({"tokens": out})
        return JSONResponse({"tokens": toks})

    async def detokenize(self, request: Request):
        body = await request.json()
        toks = body.get("tokens", [])
        try:
            self.engine.model.check_tokens(toks)
        except ValueError as ex:
            return error(400, str(ex), "invalid_request_error")
        return JSONResponse({"content": self.engine.model.detokenize(toks)})

    async def metrics(self, request: Request):
        if not self.p.metrics:
            return error(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                         "not_supported_error")
        def picture():
            with self.engine.locked() as core:  # one consistent picture, no step in between
                return (dataclasses.replace(core.metrics), sum(1 for s in core.slots if s.is_processing),
                        len(core.tq.deferred))

        m, busy, n_deferred = await run_in_threadpool(picture)
        lines = []

        def metric(name, typ, help_, value):
            lines.extend([f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {typ}", f"llamacpp:{name} {value}"])

        metric("prompt_tokens_total", "counter", "Number of prompt tokens processed.", m.prompt_tokens_total)
        metric("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache.",
               m.prompt_tokens_cached_total)
        metric("prompt_seconds_total", "counter", "Prompt process time", round(m.prompt_seconds_total, 6))
        metric("tokens_predicted_total", "counter", "Number of generation tokens processed.", m.tokens_predicted_total)
        metric("n_decode_total", "counter", "Total number of llama_decode() calls", m.n_decode_total)
        metric("n_tokens_max", "counter", "Largest observed n_tokens.", m.n_tokens_max)
        metric("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", m.spec_draft_tokens_total)
        metric("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted draft tokens.",
               m.spec_accepted_tokens_total)
        metric("requests_processing", "gauge", "Number of requests processing.", busy)
        metric("requests_deferred", "gauge", "Number of requests deferred.", n_deferred)
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4",
                                 headers={"Process-Start-Time-Unix": str(int(self.t0))})

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [{"id": self.model_name(), "object": "model",
                                                         "created": int(self.t0), "owned_by": "slotlab"}]})

    # ---------------------------------------------------------------- completions

    async def _body(self, request: Request):
        try:
            body = await request.json()
        except Exception:
            return None, error(400, "Invalid JSON in the request body", "invalid_request_error")
        if not isinstance(body, dict):
            return None, error(400, "the request body must be a JSON object", "invalid_request_error")
        bad = self._check_fields(body)
        return body, bad

    async def completion(self, request: Request):
        body, bad = await self._body(request)
        if bad is not None:
            return bad
        if "prompt" not in body:
            return error(400, "\"prompt\" is required", "invalid_request_error")
        return await self._run(request, body, body["prompt"], kind="completion")

    async def v1_completions(self, request: Request):
        body, bad = await self._body(request)
        if bad is not None:
            return bad
        if "prompt" not in body:
            return error(400, "\"prompt\" is required", "invalid_request_error")
        return await self._run(request, body, body["prompt"], kind="oai_text")

    async def v1_chat(self, request: Request):
        body, bad = await self._body(request)
        if bad is not None:
            return bad
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return error(400, "'messages' is required and must be a non-empty array", "invalid_request_error")
        try:
            prompt = self.chat.apply(msgs)
        except Exception as ex:
            return error(400, str(ex), "invalid_request_error")
        body = dict(body)
        body.setdefault("message_delimiters", self.chat.delimiters())
        return await self._run(request, body, prompt, kind="oai_chat")

    async def _run(self, request: Request, body: dict, prompt, kind: str):
        if int(body.get("n", 1) or 1) != 1:
            return not_supported("n > 1")
        try:
            tokens = self._prompt_tokens(prompt)
        except ValueError as ex:
            return error(400, str(ex), "invalid_request_error")
        stream = bool(body.get("stream", False))
        if not stream:
            try:
                task = self._submit(body, tokens)
            except Exception as ex:
                return error(400, str(ex), "invalid_request_error")
            await self._await(request, task)
            if task.error is not None:
                return self._task_error(task)
            return JSONResponse(self._shape_final(task, kind))
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        model = self.engine.model

        def on_token(task, tok):
            loop.call_soon_threadsafe(q.put_nowait, ("tok", tok))

        try:
            task = self._submit(body, tokens, on_token=on_token)
        except Exception as ex:
            return error(400, str(ex), "invalid_request_error")
        task.add_done_callback(lambda t: loop.call_soon_threadsafe(q.put_nowait, ("done", None)))
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}" if kind != "completion" else None

        async def events():
            pending = b""
            first = True
            try:
                if kind == "completion" and body.get("return_progress"):
                    yield _sse({"content": "", "stop": False, "prompt_progress": {"total": int(len(tokens))}})
                while True:
                    what, tok = await q.get()
                    if what == "done":
                        break
                    pending += model.token_to_piece(tok)
                    try:
                        text = pending.decode("utf-8")
                    except UnicodeDecodeError:
                        continue  # wait for the rest of a multi-byte character
                    pending = b""
                    chunk = self._shape_chunk(text, kind, cid)
                    if first and kind == "oai_chat":
                        chunk["choices"][0]["delta"]["role"] = "assistant"  # as OpenAI's first delta
                    first = False
                    yield _sse(chunk)
                if task.error is not None:
                    yield _sse({"error": task.error.to_json()})
                else:
                    final = self._shape_final(task, kind, stream=True, cid=cid)
                    yield _sse(final)
                    if kind != "completion":
                        yield b"data: [DONE]\n\n"
            finally:
                if not task.done:
                    self.engine.cancel(task)  # the client went away mid-stream: release its slot

        return StreamingResponse(events(), media_type="text/event-stream")

    def _usage(self, r: dict) -> dict:
        return {"completion_tokens": r["tokens_predicted"], "prompt_tokens": r["tokens_evaluated"],
                "total_tokens": r["tokens_predicted"] + r["tokens_evaluated"],
                "prompt_tokens_details": {"cached_tokens": r["timings"]["cache_n"]}}

    def _shape_chunk(self, text: str, kind: str, cid: str | None) -> dict:
        if kind == "completion":
            return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1, "tokens_predicted": 0,
                    "tokens_evaluated": 0}
        created = int(time.time())
        if kind == "oai_text":
            return {"id": cid, "object": "text_completion", "created": created, "model": self.model_name(),
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}]}
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.model_name(),
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}

    def _shape_final(self, task, kind: str, stream: bool = False, cid: str | None = None) -> dict:
        r = task.result
        if kind == "completion":
            out = self._final_json(task)
            if stream:
                out["content"] = ""
            return out
        finish = "length" if r["stop_type"] == "limit" else "stop"
        cid = cid or f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if kind == "oai_text":
            choice = {"text": "" if stream else r["content"], "index": 0, "logprobs": None, "finish_reason": finish}
            return {"id": cid, "object": "text_completion", "created": created, "model": self.model_name(),
                    "choices": [choice], "usage": self._usage(r), "timings": r["timings"]}
        if stream:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.model_name(),
                    "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": self._usage(r),
                    "timings": r["timings"]}
        return {"id": cid, "object": "chat.completion", "created": created, "model": self.model_name(),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": r["content"]},
                             "finish_reason": finish}], "usage": self._usage(r), "timings": r["timings"]}


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


class ApiKey:
    """--api-key: every endpoint but /health needs `Authorization: Bearer KEY` (or `X-Api-Key`)."""

    def __init__(self, app, key: str | None):
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.key and scope["path"] not in ("/health", "/v1/health"):
            h = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            got = h.get("authorization") or h.get("x-api-key") or ""
            if got.startswith("Bearer "):
                got = got[len("Bearer "):]
            if got != self.key:
                await error(401, "Invalid API Key", "authentication_error")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(engine):
    api = Api(engine)
    routes = [
        Route("/health", api.health), Route("/v1/health", api.health), Route("/props", api.props),
        Route("/slots", api.slots), Route("/slots/{id_slot}", api.slot_action, methods=["POST"]),
        Route("/completion", api.completion, methods=["POST"]), Route("/completions", api.completion, methods=["POST"]),
        Route("/v1/completions", api.v1_completions, methods=["POST"]),
        Route("/v1/chat/completions", api.v1_chat, methods=["POST"]),
        Route("/chat/completions", api.v1_chat, methods=["POST"]),
        Route("/tokenize", api.tokenize, methods=["POST"]), Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/metrics", api.metrics), Route("/v1/models", api.models), Route("/models", api.models),
    ]
    app = Starlette(routes=routes)
    return ApiKey(app, engine.params.api_key)


def serve_in_thread(engine, host: str = "127.0.0.1", port: int = 8080, log_level: str = "warning"):
    """Start the HTTP front in a background thread (for notebooks); returns the uvicorn Server
    (`server.should_exit = True` stops it). The engine's own thread is started too."""
    import uvicorn

    engine.start()
    config = uvicorn.Config(build_app(engine), host=host, port=port, log_level=log_level, lifespan="off")
    server = uvicorn.Server(config)
    th = threading.Thread(target=server.run, name="slotlab-serve", daemon=True)
    th.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline and th.is_alive():
        time.sleep(0.05)
    return server
