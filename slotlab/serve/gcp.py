"""Google Cloud Platform (Vertex AI) compatibility, as llama-server has it (server-http.cpp gcp_params,
register_gcp_compat): with `AIP_MODE=PREDICTION` in the environment, `POST /predict` (or
`AIP_PREDICT_ROUTE`) takes `{"instances": [...]}`, each instance a request body with an
`@requestFormat` naming the route (`chatCompletions`, `completion`, `/v1/chat/completions`, ...),
runs them all at once and answers `{"predictions": [...]}` with each route's JSON answer (an error
answer is a prediction too); `AIP_HEALTH_ROUTE` is one more path for `/health`; `AIP_HTTP_PORT`
replaces `--port`. Streaming is refused per instance."""

from __future__ import annotations

import asyncio
import json
import logging
import os

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from slotlab.serve import errors as E

log = logging.getLogger("slotlab.serve")
MAX_INSTANCES = 128


def _env(env, name: str, default: str, leading_slash: bool = False) -> str:
    v = env.get(name) or ""
    if not v:
        return default
    if leading_slash and not v.startswith("/"):
        v = "/" + v
    return v


class GcpParams:
    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        self.enabled = env.get("AIP_MODE", "") == "PREDICTION"
        self.path_health = _env(env, "AIP_HEALTH_ROUTE", "", True)
        self.path_predict = _env(env, "AIP_PREDICT_ROUTE", "/predict", True)
        self.port = int(_env(env, "AIP_HTTP_PORT", "8080"))


def path_to_gcp_format(path: str) -> str:
    """"/v1/chat/completions" -> "chatCompletions", "/apply-template" -> "applyTemplate"."""
    s = path[3:] if len(path) > 3 and path.startswith("/v1") else path
    s = s[1:] if s.startswith("/") else s
    out, cap = [], False
    for c in s:
        if c in ":{":  # stop before path parameters
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def _err(message: str, code: int) -> dict:
    return {"error": E.body(code, message)}


def predict_endpoint(routes: list):
    """The /predict handler over the app's (path, endpoint) POST routes."""
    handlers: dict[str, object] = {}
    for path, endpoint in routes:
        handlers.setdefault(path, endpoint)
    alias: dict[str, str] = {}
    for path in handlers:
        alias.setdefault(path_to_gcp_format(path), path)

    async def one(request: Request, instance) -> object:
        if not isinstance(instance, dict):
            return _err("each instance must be a JSON object", 400)
        fmt = instance.get("@requestFormat")
        if not isinstance(fmt, str):
            return _err("each instance must include a string @requestFormat", 400)
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            log.warning("ignoring client-provided stream field in instance, streaming is not supported in "
                        "predict route")
            payload["stream"] = False
        path = alias.get(fmt) or (fmt if fmt in handlers else None)
        if path is None:
            return _err(f"no handler registered for @requestFormat: {fmt}", 400)
        body = json.dumps(payload).encode()
        scope = {**request.scope, "path": path, "raw_path": path.encode(), "path_params": {}}
        sent = False

        async def receive():
            nonlocal sent
            if sent:  # the body was read: what a finished request reads next
                return {"type": "http.request", "body": b"", "more_body": False}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        res = await handlers[path](Request(scope, receive))
        if isinstance(res, StreamingResponse):
            return _err("predict route does not support streaming responses", 400)
        data = bytes(getattr(res, "body", b"") or b"")
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode("utf-8", errors="replace")

    async def predict(request: Request):
        try:
            data = json.loads(await request.body())
        except ValueError as e:
            return JSONResponse(_err(str(e), 400), status_code=400)
        if not isinstance(data, dict):
            return JSONResponse(_err("request body must be a JSON object", 400), status_code=400)
        instances = data.get("instances")
        if not isinstance(instances, list):
            return JSONResponse(_err("request body must include an array field named instances", 400), status_code=400)
        if len(instances) > MAX_INSTANCES:
            return JSONResponse(_err(f"instances array exceeds maximum size of {MAX_INSTANCES}", 400), status_code=400)
        predictions = await asyncio.gather(*(one(request, inst) for inst in instances))
        return JSONResponse({"predictions": list(predictions)})

    return predict
