"""llama-server's HTTP API over a live slotlab engine (Starlette on uvicorn).

Request fields, response JSON, status codes and error texts follow the server for everything slotlab
models (spec 5.1, 8); fields it does not model get the server's `not_supported_error` (501) instead
of being ignored. The engine runs in its background thread; handlers only submit tasks and wait on
them, and a client that goes away cancels its task (its slot is released, as the server does)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid


from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from slotlab.engine import event_types as T
from slotlab.engine.metrics import Metrics
from slotlab.engine.slot_actions import check_slot_action
from slotlab.serve import anthropic as A
from slotlab.serve import responses as R
from slotlab.serve import errors as E
from slotlab.serve import fields
from slotlab.serve import info
from slotlab.serve import nljson as J
from slotlab.serve import prompts as P
from slotlab.serve.cors import Cors
from slotlab.serve.gcp import GcpParams, predict_endpoint
from slotlab.serve.results import Results
from slotlab.serve.sleep import BYPASS, Sleep
from slotlab.serve.stream import Streamer
from slotlab.serve.unmodelled import Unmodelled
from slotlab.serve.wire import Unrouted
from slotlab.serve import sampling as smp
from slotlab.serve.chat import ChatTemplate, ChatTemplateError
from slotlab.serve.chat_request import ChatRequestError

SUPPORTED = {"prompt", "n_predict", "max_tokens", "temperature", "seed", "ignore_eos", "cache_prompt", "id_slot",
             "n_cache_reuse", "stream", "return_progress", "message_delimiters", "stop", "model", "messages", "n",
             "stream_options", "user"} | smp.CHAIN_FIELDS | {"top_logprobs", "response_format", "n_cmpl"}
# fields of the server's API that slotlab does not model: an error, never silence
NOT_SUPPORTED = {"lora", "image_data", "multimodal_data", "n_keep", "n_discard",
                 "t_max_predict_ms", "n_indent", "suffix", "input_extra", "echo", "best_of"}


CHAT_FORMATS = 5  # COMMON_CHAT_FORMAT_COUNT (content-only, peg-simple, peg-native, peg-gemma4, peg-minimax-m3)


def error(code: int, message: str, type_: str | None = None, **extra) -> JSONResponse:
    return E.error(code, message, type_, **extra)


def not_supported(what: str) -> JSONResponse:
    return error(501, f"{what} is not supported by slotlab (it models llama-server's slots and caches)",
                 "not_supported_error")


#: the fields b11549 no longer reads from a raw completion's body (the chat path sets them itself)
CHAT_ONLY_11549 = frozenset({"chat_format", "generation_prompt", "parse_tool_calls", "chat_parser"})


class Api:
    def __init__(self, engine):
        self.engine = engine
        self.p = engine.params
        self.chat = ChatTemplate(engine.model, engine.params)
        self.t0 = time.time()
        # the metrics at the last /metrics scrape (rate windows): (Metrics, predict seconds, predict steps)
        self._scrape = (Metrics(), 0.0, 0)
        # metrics_on_prediction: the generation time and decode steps of every slot released with tokens
        # (the first token is free: steps = n_gen - 1), accumulated as the server's `predict` bucket
        self._predict = [0, 0]  # [microseconds, steps], written in the engine thread under its lock
        engine.events.subscribe(self._on_event)
        self.results = Results(engine)  # what a finished task answers (results.py; the streamer uses it too)
        self.sleep = Sleep(engine, int(getattr(self.p, "sleep_idle_seconds", -1)),  # --sleep-idle-seconds
                           picture=self.picture)

    # ---------------------------------------------------------------- helpers

    def _on_event(self, ev) -> None:
        if ev.kind == T.SLOT_RELEASE and ev.slot >= 0:  # callback_on_reset: before the slot's stats go
            st = self.engine.core.slots[ev.slot].stats
            if st.n_gen > 0:
                t_us = 0 if st.t_gen_last == 0 else max(1, st.t_gen_last - st.t_prompt_last)
                self._predict[0] += t_us
                self._predict[1] += max(0, st.n_gen - 1)

    def picture(self, core) -> tuple:
        """What /metrics reads, taken under the engine's lock: (Metrics, requests processing, requests
        deferred, generation seconds, generation decode steps)."""
        return (dataclasses.replace(core.metrics), sum(1 for s in core.slots if s.is_processing),
                len(core.tq.deferred), self._predict[0] / 1e6, self._predict[1])

    def _check_fields(self, body: dict):
        bad = sorted(k for k in body if k in NOT_SUPPORTED and body[k] not in (None, False, [], {}))
        if bad:
            return not_supported(f"the request field \"{bad[0]}\"")
        return None

    def _check_trigger_words(self, values: dict) -> None:
        """The grammar_triggers handler's vocabulary check: a trigger word that is one token must be
        a preserved token (both tokenized as the server does: no specials added, specials parsed)."""
        words = [t["value"] for t in values.get("grammar_triggers") or () if t["type"] == 1]  # TRIGGER_TYPE_WORD
        if not words:
            return
        m = self.engine.model
        preserved = set()
        for p in values.get("preserved_tokens") or ():
            ids = m.tokenize(p, add_special=False, parse_special=True)
            if len(ids) == 1:
                preserved.add(int(ids[0]))
        for w in words:
            ids = m.tokenize(w, add_special=False, parse_special=True)
            if len(ids) == 1 and int(ids[0]) not in preserved:
                raise E.InvalidRequest(f"Field 'grammar_triggers': Grammar trigger word should be marked as "
                                       f"preserved token: {w}")

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

    def _values(self, body: dict) -> tuple[dict, dict]:
        """The request's fields as the server's schema reads them (slotlab.serve.fields): the values
        and the normalized body; InvalidRequest (400) with the server's text otherwise."""
        return fields.evaluate(body, info.request_defaults(self.p), len(self.engine.slots))

    def _submit(self, body: dict, tokens, on_token=None, sampling=None, values=None):
        v = values if values is not None else self._values(body)[0]
        self.sleep.touch()
        task = self.engine.submit(
            tokens, n_predict=v["n_predict"], id_slot=v["id_slot"],
            cache_prompt=body.get("cache_prompt"), n_cache_reuse=body.get("n_cache_reuse"),
            temperature=v["temperature"], seed=v["seed"], ignore_eos=v["ignore_eos"],
            message_delimiters=body.get("message_delimiters"), chat=bool(body.get("_chat")),
            stop=v["stop"], on_token=on_token, sampling=sampling)
        task.values = v  # for generation_settings, return_tokens and response_fields of its answer
        return task

    # ---------------------------------------------------------------- simple endpoints

    async def health(self, request: Request):
        return JSONResponse({"status": "ok"})

    async def props(self, request: Request):
        props = info.props_json(self.engine, self.chat, self.p, self.results.model_name())
        props["is_sleeping"] = self.sleep.sleeping
        return JSONResponse(props)

    async def post_props(self, request: Request):
        """POST /props: with --props the server accepts it and changes nothing (SC:4797-4807)."""
        if not getattr(self.p, "endpoint_props", False):
            return error(501, "This server does not support changing global properties. Start it with `--props`",
                         "not_supported_error")
        return JSONResponse({"success": True})

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
        rest = request.path_params["id_slot"]  # httplib's "/slots/:id_slot": one segment, a trailing "/" allowed
        cut = rest.find("/")
        if 0 <= cut < len(rest) - 1:
            return await E.not_found(request)
        try:  # the server decodes a path parameter once more (decode_path_component), then std::stoi
            id_slot = stoi(decode_path_component(rest[:cut] if cut >= 0 else rest))
        except ValueError:
            return error(400, "Invalid slot ID", "invalid_request_error")
        if id_slot < 0:  # the server's answer is undefined here (it wraps to some slot): refuse clearly
            return error(400, f"Invalid slot ID: {id_slot} is negative (slot ids are 0..{len(self.engine.slots) - 1})",
                         "invalid_request_error")
        action = request.query_params.get("action", "")
        err = check_slot_action(self.p.slot_save_path, action, check_filename=False)
        if err is not None:
            return error(err.code, err.message, err.type)
        filename = None
        if action != "erase":  # json::parse and at("filename") outside any try: JSON errors are 500s
            filename = J.get_str(J.at(J.parse(await request.body()), "filename"))
        self.sleep.touch()
        task = self.engine.slot_action(action, id_slot, filename)
        await self._await(request, task)
        if task.error is not None:
            return self.results.task_error(task)
        return JSONResponse(task.result)

    async def tokenize(self, request: Request):
        """/tokenize (SC:5065-5104): a body without `content` (or not an object) has no tokens; a
        `content` of the wrong type is nlohmann's type error, a 500 as in the server."""
        body = J.parse(await request.body())
        if not isinstance(body, dict) or "content" not in body:
            return JSONResponse({"tokens": []})
        add_special = J.json_value(body, "add_special", False, J.get_bool)
        parse_special = J.json_value(body, "parse_special", True, J.get_bool)
        m = self.engine.model
        toks = P.tokenize_mixed(m, body["content"], add_special, parse_special)
        if J.json_value(body, "with_pieces", False, J.get_bool):
            P.detokenize_checked(m, toks)  # a piece of an id outside the vocabulary: vector::at's error
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
        """/detokenize (SC:5106-5118): bad ids and types are 500s with the server's texts."""
        body = J.parse(await request.body())
        if not isinstance(body, dict) or "tokens" not in body:
            return JSONResponse({"content": ""})
        return JSONResponse({"content": P.detokenize_checked(self.engine.model, body["tokens"])})

    async def metrics(self, request: Request):
        if not self.p.metrics:
            return error(501, "This server does not support metrics endpoint. Start it with `--metrics`",
                         "not_supported_error")
        def picture():
            if self.sleep.sleeping and self.sleep.snapshot is not None:
                return self.sleep.snapshot  # served from the snapshot taken on entering sleep
            with self.engine.locked() as core:  # one consistent picture, no step in between
                return self.picture(core)

        m, busy, n_deferred, pred_s, steps = await run_in_threadpool(picture)
        # the rate gauges are averaged over the window since the last scrape, as the server's buckets
        (prev, prev_pred_s, prev_steps), self._scrape = self._scrape, (m, pred_s, steps)
        d_prompt = m.prompt_tokens_total - prev.prompt_tokens_total
        d_prompt_s = m.prompt_seconds_total - prev.prompt_seconds_total
        d_pred_s, d_steps = pred_s - prev_pred_s, steps - prev_steps
        text = info.metrics_text({
            "prompt_tokens_total": m.prompt_tokens_total, "prompt_tokens_cached_total": m.prompt_tokens_cached_total,
            "prompt_seconds_total": m.prompt_seconds_total, "tokens_predicted_total": m.tokens_predicted_total,
            "tokens_predicted_seconds_total": pred_s, "n_decode_total": m.n_decode_total,
            "n_tokens_max": m.n_tokens_max, "spec_decode_num_draft_tokens_total": m.spec_draft_tokens_total,
            "spec_decode_num_accepted_tokens_total": m.spec_accepted_tokens_total,
            "spec_decode_num_drafts_total": getattr(m, "spec_drafts_total", 0),
            "prompt_tokens_seconds": d_prompt / d_prompt_s if d_prompt_s > 0 else 0.0,
            "predicted_tokens_seconds": d_steps / d_pred_s if d_pred_s > 0 else 0.0,
            "requests_processing": busy, "requests_deferred": n_deferred,
            "n_busy_slots_per_decode": m.n_busy_slots_total / max(m.n_decode_total, 1),
        })
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4",
                                 headers={"Process-Start-Time-Unix": str(int(self.t0))})

    async def models(self, request: Request):
        """/models and /v1/models (SC:4527-4588, SC:5053-5063)."""
        m = self.engine.model
        name = self.results.model_name()
        meta = {"n_vocab": m.n_vocab, "n_ctx": self.engine.n_ctx_slot, "n_ctx_train": m.n_ctx_train,
                "n_params": m.n_params, "size": m.size_bytes}
        return JSONResponse(info.models_json(name, self.results.aliases() or [name], list(getattr(self.p, "model_tags", ())),
                                             int(time.time()), meta, self.p.server_build))

    # ---------------------------------------------------------------- completions

    async def _json(self, request: Request):
        """json::parse of the body: nlohmann's parse errors, answered 500 as the route wrapper does."""
        return J.parse(await request.body())

    def _fields(self, body, prompt):
        """What handle_completions_impl does inside its try (every error 400): `at("prompt")` and its
        tokenizing (`prompt` is None for the text endpoints), then the field schema."""
        try:
            inputs = P.tokenize_prompts(self.engine.model, J.at(body, "prompt") if prompt is None else prompt)
            values, norm = self._values(body)
        except (J.JsonError, ValueError) as ex:
            raise E.InvalidRequest(str(ex)) from None
        return inputs, values, norm

    async def completion(self, request: Request):
        return await self._run(request, await self._json(request), None, kind="completion")

    async def v1_completions(self, request: Request):
        return await self._run(request, await self._json(request), None, kind="oai_text")

    async def v1_chat(self, request: Request):
        return await self._chat(request, await self._json(request), "oai_chat")

    async def _anthropic_body(self, request: Request) -> dict:
        """Anthropic's request body as an OpenAI chat request (slotlab.serve.anthropic)."""
        body = await self._json(request)
        try:
            return A.to_oai(body if isinstance(body, dict) else {})
        except RuntimeError as ex:
            raise E.ServerError(str(ex)) from None

    async def v1_messages(self, request: Request):
        """/v1/messages: Anthropic's request as an OpenAI chat request."""
        return await self._chat(request, await self._anthropic_body(request), "anthropic")

    async def _chat(self, request: Request, body, kind: str):
        """oaicompat_chat_params_parse, then the completion path. Its runtime errors are 500s and its
        invalid_argument ones 400s, as the route wrapper answers them (SRV:54-86)."""
        if not isinstance(body, dict):
            body = {}  # json_value / contains on a non-object find nothing: "'messages' is required"
        if body.get("json_schema") is not None and J.json_value(body, "grammar", "", J.get_str):
            raise E.ServerError("Cannot use both json_schema and grammar")
        try:
            body = smp.chat_fields(body)
        except ValueError as ex:
            raise E.InvalidRequest(str(ex)) from None
        try:
            prompt = await run_in_threadpool(self.chat.apply_request, body)
        except ChatRequestError as ex:
            raise (E.InvalidRequest if ex.code == 400 else E.ServerError)(str(ex)) from None
        body = dict(body)
        body["message_delimiters"] = self.chat.delimiters()  # the template's, whatever the body said (server-common.cpp 1410)
        body["_chat"] = True  # the chat path: its delimiters are the template's (every build reads them)
        # llama_params the chat path sets from the template, whatever the request said (a plain template:
        # content-only, no lazy grammar, no triggers, no preserved tokens)
        body.update({"chat_format": 0, "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": []})
        return await self._run(request, body, prompt, kind=kind)

    async def apply_template(self, request: Request):
        """`/apply-template`: the chat path's prompt without inference (post_apply_template runs
        oaicompat_chat_params_parse and answers {"prompt": ...}); rendering in slotlab.serve.chat."""
        body = await self._json(request)
        if not isinstance(body, dict):
            body = {}  # as in v1_chat: "'messages' is required"
        try:
            prompt = await run_in_threadpool(self.chat.apply_request, body)
        except ChatRequestError as ex:
            raise (E.InvalidRequest if ex.code == 400 else E.ServerError)(str(ex)) from None
        except ChatTemplateError as ex:
            raise E.ServerError(str(ex)) from None
        return JSONResponse({"prompt": prompt})

    async def input_tokens(self, request: Request):
        return await self._count_tokens(await self._json(request))

    async def v1_responses(self, request: Request):
        """/v1/responses: OpenAI's Responses request as a chat request (slotlab.serve.responses)."""
        return await self._chat(request, self._responses_body(await self._json(request)), "responses")

    async def responses_input_tokens(self, request: Request):
        return await self._count_tokens(self._responses_body(await self._json(request)))

    @staticmethod
    def _responses_body(body) -> dict:
        try:
            return R.to_chat(body if isinstance(body, dict) else {})
        except R.ResponsesError as ex:
            raise E.InvalidRequest(str(ex)) from None

    async def anthropic_count_tokens(self, request: Request):
        return await self._count_tokens(await self._anthropic_body(request))

    async def _count_tokens(self, body):
        """handle_count_tokens (/chat/completions/input_tokens, /v1/messages/count_tokens): the chat
        path's prompt, tokenized as the completion path tokenizes it (specials added and parsed)."""
        if not isinstance(body, dict):
            body = {}
        try:
            prompt = await run_in_threadpool(self.chat.apply_request, smp.chat_fields(body))
        except ChatRequestError as ex:
            raise (E.InvalidRequest if ex.code == 400 else E.ServerError)(str(ex)) from None
        except ChatTemplateError as ex:
            raise E.ServerError(str(ex)) from None
        except ValueError as ex:
            raise E.InvalidRequest(str(ex)) from None
        return JSONResponse({"input_tokens": int(len(self._prompt_tokens(prompt)))})

    async def _run(self, request: Request, body: dict, prompt, kind: str):
        if self.p.server_build >= 11549 and isinstance(body, dict) and not body.get("_chat"):
            # b11549 reads these only from the chat path's own parameters (server-schema.cpp has no
            # field for them): a raw completion's are ignored, not checked
            body = {k: v for k, v in body.items() if k not in CHAT_ONLY_11549}
        inputs, values, body = self._fields(body, prompt)  # body: normalized (converted, nulls dropped)
        if "chat_format" in body and not 0 <= values["chat_format"] < CHAT_FORMATS:
            raise E.ServerError("Unknown chat format")  # common_chat_format_name, as the answer is built
        self._check_trigger_words(values)
        bad = self._check_fields(body)
        if bad is not None:
            return bad
        try:  # the sampling fields, read as the server reads them (slotlab.serve.sampling)
            sampling = smp.sampling_params(body, self.engine.model)
        except ValueError as ex:
            raise E.InvalidRequest(str(ex)) from None
        n_cmpl = values["n_cmpl"]
        stream = values["stream"]
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}" if kind != "completion" else None  # gen_chatcmplid
        streamer = Streamer(self, kind, cid) if stream else None
        tasks = []
        try:  # prompt i, choice j: the server's task i and its child j (seed + j when one is set)
            with self.engine.locked():  # no step before the streamer follows every task
                if streamer is not None:
                    streamer.subscribe()
                for i, toks in enumerate(inputs):
                    for j in range(n_cmpl):
                        bj = smp.child_body(body, j)
                        vj = values if j == 0 else dict(values, seed=bj.get("seed", values["seed"]))
                        t = self._submit(bj, toks, values=vj,
                                         sampling=sampling if j == 0 else smp.sampling_params(bj, self.engine.model),
                                         on_token=streamer.on_token if streamer is not None else None)
                        t.index = i * n_cmpl + j
                        tasks.append(t)
                        if streamer is not None:
                            streamer.watch(t)
        except Exception as ex:
            for t in tasks:
                self.engine.cancel(t)
            if streamer is not None:
                streamer.close()
            raise E.InvalidRequest(str(ex)) from ex
        if streamer is not None:
            return await streamer.response(request)
        for t in tasks:
            await self._await(request, t)
        for t in tasks:
            if t.error is not None:
                return self.results.task_error(t)
        outs = [self.results.shape_final(t, kind, cid=cid) for t in tasks]
        if len(outs) == 1:
            return JSONResponse(outs[0])
        if kind == "completion":
            return JSONResponse(outs)  # multi-results, non-OAI: an array
        for o in outs[1:]:
            outs[0]["choices"].append(o["choices"][0])
        return JSONResponse(outs[0])


def stoi(s: str) -> int:
    """std::stoi: leading whitespace, one optional sign, the leading decimal digits ("1abc" is 1);
    ValueError (invalid_argument / out_of_range) for no digits or a value outside int32."""
    i = 0
    while i < len(s) and s[i] in " \t\n\v\f\r":
        i += 1
    j = i + 1 if i < len(s) and s[i] in "+-" else i
    k = j
    while k < len(s) and "0" <= s[k] <= "9":
        k += 1
    if k == j:
        raise ValueError("stoi: no conversion")
    v = int(s[i:k])
    if not J.INT32_MIN <= v <= J.INT32_MAX:
        raise ValueError("stoi: out of range")
    return v


def decode_path_component(s: str) -> str:
    """server-http.cpp decode_path_component: %XX with two hex digits is the byte, anything else stays."""
    b = s.encode("utf-8", "surrogateescape")
    out, i = bytearray(), 0
    while i < len(b):
        if b[i] == 0x25 and i + 2 < len(b) and all(chr(c) in "0123456789abcdefABCDEF" for c in b[i + 1:i + 3]):
            out.append(int(b[i + 1:i + 3], 16))
            i += 3
            continue
        out.append(b[i])
        i += 1
    return out.decode("utf-8", "replace")


class Waker:
    """--sleep-idle-seconds: a request other than the read-only ones wakes the server before its
    handler runs (create_response -> wait_until_no_sleep), off the event loop."""

    def __init__(self, app, sleep, bypass=BYPASS):
        self.app, self.sleep, self.bypass = app, sleep, bypass

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.sleep.sleeping and (scope["method"], scope["path"]) not in self.bypass:
            await run_in_threadpool(self.sleep.wake)
        await self.app(scope, receive, send)


class ApiKey:
    """--api-key / --api-key-file: every endpoint but the public ones needs one of the keys, as
    `Authorization: Bearer KEY` or `X-Api-Key` (server-http.cpp middleware_validate_api_key: any key of
    the list). Compared as bytes, as the server compares std::strings (a header value that is not UTF-8
    is just a wrong key); of a repeated header the first counts (httplib's get_header_value), and an
    empty or absent `Authorization` falls back to `X-Api-Key`. Public: `/health`, `/v1/health` and `/`
    (the UI's entry, public even with the UI off)."""

    PUBLIC = ("/health", "/v1/health", "/")

    def __init__(self, app, keys):
        self.app = app
        self.keys = frozenset(k.encode("utf-8", "surrogateescape") if isinstance(k, str) else bytes(k)
                              for k in keys if k)

    @staticmethod
    def first(headers, name: bytes) -> bytes:
        for k, v in headers:
            if k.lower() == name:
                return v
        return b""

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.keys and scope["path"] not in self.PUBLIC:
            got = self.first(scope["headers"], b"authorization") or self.first(scope["headers"], b"x-api-key")
            if got.startswith(b"Bearer "):
                got = got[len(b"Bearer "):]
            if got not in self.keys:
                await error(401, "Invalid API Key", "authentication_error")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(engine):
    api = Api(engine)
    routes = [
        Route("/health", api.health), Route("/v1/health", api.health), Route("/props", api.props),
        Route("/props", api.post_props, methods=["POST"]),
        Route("/slots", api.slots), Route("/slots/{id_slot:path}", api.slot_action, methods=["POST"]),
        Route("/completion", api.completion, methods=["POST"]), Route("/completions", api.completion, methods=["POST"]),
        Route("/v1/completions", api.v1_completions, methods=["POST"]),
        Route("/v1/chat/completions", api.v1_chat, methods=["POST"]),
        Route("/chat/completions", api.v1_chat, methods=["POST"]),
        Route("/tokenize", api.tokenize, methods=["POST"]), Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/apply-template", api.apply_template, methods=["POST"]),
        Route("/chat/completions/input_tokens", api.input_tokens, methods=["POST"]),
        Route("/v1/messages", api.v1_messages, methods=["POST"]),
        Route("/v1/responses", api.v1_responses, methods=["POST"]), Route("/responses", api.v1_responses, methods=["POST"]),
        Route("/v1/responses/input_tokens", api.responses_input_tokens, methods=["POST"]),
        Route("/responses/input_tokens", api.responses_input_tokens, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.anthropic_count_tokens, methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", api.input_tokens, methods=["POST"]),
        Route("/metrics", api.metrics), Route("/v1/models", api.models), Route("/models", api.models),
    ]
    # the server's other routes, answered as it answers them without the feature (slotlab.serve.unmodelled)
    routes += [Route(path, fn, methods=m) for path, fn, m in Unmodelled(engine.params, fim=engine.model.fim_tokens() if engine.model is not None else None).routes()]
    # ex_wrapper: an exception is the server's JSON error, never a plain-text page
    build = engine.params.server_build  # from b11434 a JSON parse or type error is a 400 (ex_wrapper)
    routes = [Route(r.path, E.wrap(r.endpoint, build), methods=r.methods) for r in routes]
    gcp = GcpParams()
    if gcp.enabled:  # AIP_MODE=PREDICTION (slotlab/serve/gcp.py)
        posts = [(r.path, r.endpoint) for r in routes if "POST" in (r.methods or ())]
        if gcp.path_health:
            routes.append(Route(gcp.path_health, E.wrap(api.health, build)))
        routes.append(Route(gcp.path_predict, E.wrap(predict_endpoint(posts), build), methods=["POST"]))
    # a path the server has not (or a method it has not there) is its JSON 404
    app = Starlette(routes=routes, exception_handlers={404: E.not_found, 405: E.not_found})
    app.router.redirect_slashes = False  # httplib matches paths exactly: "/completion/" is a 404
    api.sleep.start()
    app = Waker(app, api.sleep, BYPASS | ({("GET", gcp.path_health)} if gcp.enabled and gcp.path_health else set()))
    keys = getattr(engine.params, "api_keys", ()) or (engine.params.api_key,)
    return E.ServerErrors(Cors(ApiKey(Unrouted(app), keys), engine.params))


def serve_in_thread(engine, host: str = "127.0.0.1", port: int = 8080, log_level: str = "warning"):
    """Start the HTTP front in a background thread (for notebooks); returns the uvicorn Server
    (`server.should_exit = True` stops it). The engine's own thread is started too."""
    import uvicorn

    from slotlab.serve.wire import uvicorn_options

    engine.start()
    config = uvicorn.Config(build_app(engine), host=host, port=port, log_level=log_level, lifespan="off",
                            **uvicorn_options())
    server = uvicorn.Server(config)
    th = threading.Thread(target=server.run, name="slotlab-serve", daemon=True)
    th.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline and th.is_alive():
        time.sleep(0.05)
    return server
