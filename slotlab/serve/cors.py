"""CORS as llama-server's pre-routing handler sets it (server-http.cpp, init_listener).

Every answer gets `Access-Control-Allow-Origin`: with `--cors-credentials` (default) and
`--cors-origins *` (default) the request's Origin is echoed (an empty value when there is none);
`--cors-origins localhost` reflects only a localhost origin; any other value is sent as given. An
OPTIONS request is a preflight: 200, an empty text/html body, the credentials / methods / headers
lines, and no API key check (browsers send none). Runs before the API key middleware, as there.
Header names go out in cpp-httplib's case (`Access-Control-Allow-Origin`, and every header of the
answer: `Content-Type`, `Process-Start-Time-Unix`): HTTP says case does not matter, but llama.cpp's
own server tests read them from a plain dict."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

log = logging.getLogger("slotlab.serve")


def canonical_name(name: bytes) -> bytes:
    """A header name in the case cpp-httplib sends the server's headers (`Content-Type`,
    `Process-Start-Time-Unix`): Starlette lowercases what it sets."""
    return b"-".join(part[:1].upper() + part[1:].lower() for part in name.split(b"-"))


def origin_is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname or ""
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


class Cors:
    def __init__(self, app, params):
        self.app = app
        self.origins = getattr(params, "cors_origins", "*")
        self.methods = getattr(params, "cors_methods", "GET, POST, DELETE, OPTIONS")
        self.headers = getattr(params, "cors_headers", "*")
        self.credentials = getattr(params, "cors_credentials", True)

    def _allow_origin(self, origin: str) -> str | None:
        if self.credentials and self.origins == "*":
            return origin
        if self.origins == "localhost":
            if origin and origin_is_localhost(origin):
                return origin
            if origin:
                log.warning("(CORS) skip non-localhost origin: %s", origin)
            return None
        return self.origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"origin"), "")
        allow = self._allow_origin(origin)  # of two Origin headers the first, as get_header_value
        extra = [] if allow is None else [(b"Access-Control-Allow-Origin", allow.encode("latin-1"))]
        if scope["method"] == "OPTIONS":
            extra += [(b"Access-Control-Allow-Credentials", b"true" if self.credentials else b"false"),
                      (b"Access-Control-Allow-Methods", self.methods.encode("latin-1")),
                      (b"Access-Control-Allow-Headers", self.headers.encode("latin-1")),
                      (b"Content-Type", b"text/html"), (b"Content-Length", b"0")]
            await send({"type": "http.response.start", "status": 200, "headers": extra})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_(msg):
            if msg["type"] == "http.response.start":
                own = [(canonical_name(k), v) for k, v in msg.get("headers", [])]
                msg = {**msg, "headers": [*own, *extra]}
            await send(msg)

        await self.app(scope, receive, send_)
