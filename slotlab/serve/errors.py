"""The server's error answers: `{"error": {"code", "message", "type"}}` and where each comes from.

llama-server wraps every route in `ex_wrapper` (SRV:54-86): a `std::invalid_argument` becomes 400
`invalid_request_error`, any other exception 500 `server_error`, both with the exception's text and a
`got exception: ...` warning in the log. Unknown paths (and a known path with another method) are 404
`File Not Found` (server-http.cpp's error handler). `wrap` and `ServerErrors` give slotlab serve the
same: no path answers a plain-text 500, and the log names what went wrong."""

from __future__ import annotations

import json
import logging

from starlette.responses import JSONResponse, Response

log = logging.getLogger("slotlab.serve")

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
         500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class InvalidRequest(ValueError):
    """The server's `std::invalid_argument` (or an error inside the completion handler's try): 400."""


class ServerError(RuntimeError):
    """Any other exception a route lets out: 500 server_error with this text."""


def body(code: int, message: str, type_: str | None = None, **extra) -> dict:
    """format_error_response (SCM:36-78), plus the extra fields some errors carry (n_prompt_tokens, n_ctx)."""
    return {"code": code, "message": message, "type": type_ or TYPES.get(code, "server_error"), **extra}


def error(code: int, message: str, type_: str | None = None, **extra) -> JSONResponse:
    return JSONResponse({"error": body(code, message, type_, **extra)}, status_code=code)


def from_exception(e: BaseException, server_build: int = 11312) -> JSONResponse:
    """ex_wrapper's answer for an exception a handler let out, logged as the server logs it. From
    b11434 ex_wrapper also catches `common_json_error` (nlohmann's parse and type errors: slotlab's
    nljson.JsonError) as 400 invalid_request_error (server.cpp:65 there); the pin lets them be 500s."""
    from slotlab.serve.nljson import JsonError

    code = 400 if isinstance(e, InvalidRequest) or (server_build >= 11434 and isinstance(e, JsonError)) else 500
    err = {"error": body(code, str(e) or type(e).__name__)}
    if code == 500 and not isinstance(e, ServerError) and type(e).__module__ != "slotlab.serve.nljson":
        log.warning("got exception: %s", json.dumps(err), exc_info=e)
    else:
        log.warning("got exception: %s", json.dumps(err))
    return JSONResponse(err, status_code=code)


def wrap(handler, server_build: int = 11312):
    """ex_wrapper for one route handler (of `server_build`'s rules); first httplib's reading of the
    body, which happens once the route matched and the key was accepted (slotlab.serve.wire.body_error:
    an empty 400 or 415)."""
    from slotlab.serve.wire import body_error

    async def route(request):
        status = body_error(request.scope)
        if status is not None:
            return Response(status_code=status, headers={"Connection": "close"})
        try:
            return await handler(request)
        except Exception as e:  # noqa: BLE001 - every exception becomes the server's JSON answer
            return from_exception(e, server_build)
    route.__name__ = getattr(handler, "__name__", "route")
    route.__doc__ = handler.__doc__
    return route


async def not_found(request, exc=None) -> JSONResponse:
    """server-http.cpp's error handler: a 404 body with its keys in that order."""
    return JSONResponse({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}},
                        status_code=404)


class ServerErrors:
    """The last net (ASGI middleware): an exception that escapes a route or another middleware is
    answered with the server's JSON 500 and logged, never Starlette's plain-text page."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, receive, send_)
        except Exception as e:  # noqa: BLE001
            log.exception("unhandled exception on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise  # headers are out: nothing else can be sent
            await from_exception(ServerError(str(e) or type(e).__name__))(scope, receive, send)
