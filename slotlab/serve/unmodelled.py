"""The routes of llama-server that slotlab does not model, answered as the server answers them on a
server started with the same flags, as far as that answer does not need the feature itself
(tools/server/server.cpp registers them; the handlers are in server-context.cpp and
server-stream.cpp):

- `/embedding`, `/embeddings`, `/v1/embeddings`: without `--embeddings` the server's 501;
- `/rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`: without `--reranking` its 501;
- `/v1/audio/transcriptions`, `/audio/transcriptions`: no audio projector, its 501;
- `/lora-adapters`: GET lists no adapters, POST refuses a body that is not an array;
- `/v1/chat/completions/control`: its checks of `id` and `action`;
- `/v1/stream`, `/v1/streams/lookup`: slotlab keeps no resumable streams, so every id is unknown;
- `/cors-proxy`, `/tools`: off by default, the server's 403;
- `/sw.js` with the UI off: the service worker that removes itself.
Whatever goes past those answers (an embedding, an infill, a LoRA change, a stream replay) is
slotlab's `not_supported_error` (501), never a pretended result."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from slotlab.serve import errors as E
from slotlab.serve import nljson as J

SW_REMOVE_JS = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""


def _not_modelled(what: str) -> JSONResponse:
    return E.error(501, f"{what} is not supported by slotlab (it models llama-server's slots and caches)",
                   "not_supported_error")


def infill_unsupported(fim: tuple[int, int, int] | None) -> str:
    """The server's reason to refuse `/infill` for a model (server-context.cpp:4813-4824): each missing
    FIM token named in its order; empty when the model has all three (or none is known: no model)."""
    if fim is None:
        return ""
    names = ("prefix", "suffix", "middle")
    return "".join(f"{n} token is missing. " for n, t in zip(names, fim) if t < 0)


class Unmodelled:
    def __init__(self, params, fim: tuple[int, int, int] | None = None):
        self.p = params
        self.infill_err = infill_unsupported(fim)

    async def embeddings(self, request: Request):
        if not getattr(self.p, "embedding", False):
            return E.error(501, "This server does not support embeddings. Start it with `--embeddings`",
                           "not_supported_error")
        return _not_modelled("embeddings")

    async def rerank(self, request: Request):
        if not getattr(self.p, "embedding", False) or getattr(self.p, "pooling_type", None) != "rank":
            return E.error(501, "This server does not support reranking. Start it with `--reranking`",
                           "not_supported_error")
        return _not_modelled("reranking")

    async def infill(self, request: Request):
        # the model check comes first, before the body is read (as the server's handler does)
        if self.infill_err:
            return E.error(501, f"Infill is not supported by this model: {self.infill_err}", "not_supported_error")
        return _not_modelled("/infill")

    async def transcriptions(self, request: Request):
        return E.error(501, "The current model does not support audio input.", "not_supported_error")

    async def get_lora(self, request: Request):
        return JSONResponse([])

    async def post_lora(self, request: Request):
        body = J.parse(await request.body())
        if not isinstance(body, list):
            return E.error(400, "Request body must be an array", "invalid_request_error")
        return _not_modelled("LoRA adapters")

    async def control(self, request: Request):
        body = J.parse(await request.body())
        if not J.json_value(body, "id", "", J.get_str):
            return E.error(400, "missing completion id", "invalid_request_error")
        if J.json_value(body, "action", "", J.get_str) != "reasoning_end":
            return E.error(400, "unknown control action", "invalid_request_error")
        return _not_modelled("the control of a running completion")

    async def stream_get(self, request: Request):
        if not request.query_params.get("conv_id"):
            return E.error(400, "Missing conversation id in path", "invalid_request_error")
        return E.error(404, "Stream not found or expired", "not_found_error")

    async def stream_delete(self, request: Request):
        if not request.query_params.get("conv_id"):
            return E.error(400, "Missing conversation id in path", "invalid_request_error")
        return Response(status_code=204, media_type="application/json")

    async def streams_lookup(self, request: Request):
        try:
            J.parse(await request.body())
        except J.JsonError as ex:
            return JSONResponse({"error": {"message": f"invalid body: {ex}", "type": "invalid_request_error"}},
                                status_code=400)
        return JSONResponse([])

    async def disabled(self, request: Request):
        return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}},
                            status_code=403)

    async def sw_js(self, request: Request):
        return Response(SW_REMOVE_JS, media_type="application/javascript", headers={"Cache-Control": "no-cache"})

    def routes(self) -> list[tuple[str, object, list[str] | None]]:
        """(path, endpoint, methods): None is GET (and HEAD)."""
        post = ["POST"]
        out = [(p, self.embeddings, post) for p in ("/embedding", "/embeddings", "/v1/embeddings")]
        out += [(p, self.rerank, post) for p in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")]
        out += [(p, self.transcriptions, post) for p in ("/v1/audio/transcriptions", "/audio/transcriptions")]
        out += [("/infill", self.infill, post), ("/lora-adapters", self.get_lora, None),
                ("/lora-adapters", self.post_lora, post), ("/v1/chat/completions/control", self.control, post),
                ("/v1/stream", self.stream_get, None), ("/v1/stream", self.stream_delete, ["DELETE"]),
                ("/v1/streams/lookup", self.streams_lookup, post), ("/cors-proxy", self.disabled, None),
                ("/cors-proxy", self.disabled, post), ("/tools", self.disabled, None), ("/tools", self.disabled, post),
                ("/sw.js", self.sw_js, None)]
        return out
