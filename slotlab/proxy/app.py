"""A pass-through HTTP/1.1 proxy in front of llama-server (or any OpenAI-compatible server), on asyncio
streams: every request is forwarded to `upstream` over a pool of kept-alive connections and the
answer is copied back as it arrives.

What passes unchanged: the method, path and query (behind the upstream URL's own path, if it has one),
every request header except the hop-by-hop ones, `Host`, `Expect` and the body framing (the proxy sets
`Host` and `Content-Length` for the upstream), so `Authorization` / `X-Api-Key` reach the server as
sent; the request body; the status line and every response header except the hop-by-hop ones; and
the body bytes exactly as the upstream framed them (a chunked answer is passed chunk for chunk with its
framing, a `Content-Length` one byte for byte). Server-Sent Events stream through as they come.

A client that goes away is propagated: when its connection ends (EOF or reset) while the upstream is
still answering, the proxy closes that upstream connection at once, which is how llama-server learns
that its client left (it cancels the task and releases the slot); nothing is polled per chunk.

Why not a general HTTP stack: a proxy that parses and re-serialises every message (uvicorn + httpx, both
on the pure-Python h11 here) added ~3.5 ms per request on a loaded 2-core machine; copying bytes on
asyncio streams adds a small fraction of that (`bench/proxy_latency.py`).

`tap(info)`: called when a request arrives (a `RequestInfo`); it returns None or an object with
`body(chunk)` (the answer's payload, de-chunked) and `done(status, headers, cancelled)`; the recorder
(slotlab.proxy.record) is one. The proxy adds no byte of its own to an answer; an upstream it cannot
reach gets a 502 with a JSON error body (`type: proxy_error`)."""

from __future__ import annotations

import asyncio
import json
import ssl as _ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

#: hop-by-hop headers (RFC 9110 7.6.1) and the ones the proxy sets itself for the upstream
REQUEST_DROP = frozenset((b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                          b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length", b"expect",
                          b"proxy-connection"))
RESPONSE_DROP = frozenset((b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                           b"trailer", b"upgrade", b"proxy-connection"))
#: the largest request / response head accepted
MAX_HEAD = 1 << 20
#: the largest request body accepted (a 413 beyond)
MAX_BODY = 512 << 20
#: seconds a client connection may stay idle between requests
KEEP_ALIVE = 75.0


@dataclass
class RequestInfo:
    """A request as it arrived (for a tap): `t` is `time.perf_counter()` at arrival."""

    t: float
    method: str
    path: str
    query: str
    headers: list  # [(name bytes lower-case, value bytes)]
    body: bytes


class _Closed(Exception):
    """The upstream closed the connection."""


class _ClientGone(Exception):
    """The client left while the upstream was answering."""


class _ClientProtocol(asyncio.StreamReaderProtocol):
    """A client connection that knows when its client is gone (EOF or connection lost)."""

    def __init__(self, proxy: "Proxy"):
        self.gone = False
        self.on_gone = None  # set while an upstream answers: closes that upstream connection
        super().__init__(asyncio.StreamReader(limit=MAX_HEAD), proxy._client_conn)

    def _left(self) -> None:
        self.gone = True
        if self.on_gone is not None:
            self.on_gone()
            self.on_gone = None

    def eof_received(self):
        self._left()
        return super().eof_received()

    def connection_lost(self, exc):
        self._left()
        super().connection_lost(exc)


def _parse_head(head: bytes) -> tuple[bytes, list]:
    """(first line, [(name, value, the line as sent)]): lines are forwarded as they came, byte for byte."""
    lines = head.split(b"\r\n")
    first = lines[0]
    headers = []
    for ln in lines[1:]:
        if not ln:
            continue
        if ln[:1] in (b" ", b"\t") and headers:  # obsolete line folding: part of the previous header
            k, v, raw = headers[-1]
            headers[-1] = (k, v + b" " + ln.strip(), raw + b"\r\n" + ln)
            continue
        k, sep, v = ln.partition(b":")
        if not sep:
            raise ValueError(f"bad header line {ln[:80]!r}")
        headers.append((k.strip(), v.strip(), ln))
    return first, headers


def _get(headers: list, name: bytes) -> bytes | None:
    for k, v, _ in headers:
        if k.lower() == name:
            return v
    return None


def _tokens(headers: list, name: bytes) -> set:
    out = set()
    for k, v, _ in headers:
        if k.lower() == name:
            out |= {t.strip().lower() for t in v.split(b",")}
    return out


async def _read_chunked(reader: asyncio.StreamReader, out: list | None, raw: list | None) -> None:
    """Read a chunked body: payload pieces to `out`, the bytes as framed to `raw` (either may be None)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        if raw is not None:
            raw.append(line)
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the empty line
                t = await reader.readuntil(b"\r\n")
                if raw is not None:
                    raw.append(t)
                if t == b"\r\n":
                    return
        data = await reader.readexactly(size + 2)
        if raw is not None:
            raw.append(data)
        if out is not None:
            out.append(data[:-2])


class _ChunkScanner:
    """Follows chunked transfer coding over the bytes as they come: `feed(data)` returns the payload
    pieces in `data` and how many of its bytes belong to the body (all, until the last chunk and its
    trailers end it: then `done`)."""

    def __init__(self):
        self.state = "size"
        self.need = 0
        self.head = b""  # an unfinished size / trailer line
        self.done = False

    def feed(self, data: bytes) -> tuple[list, int]:
        out = []
        i, n = 0, len(data)
        while i < n and not self.done:
            if self.state == "data":
                take = min(self.need, n - i)
                out.append(data[i:i + take])
                i += take
                self.need -= take
                if self.need == 0:
                    self.state, self.need = "crlf", 2
            elif self.state == "crlf":
                take = min(self.need, n - i)
                i += take
                self.need -= take
                if self.need == 0:
                    self.state = "size"
            else:  # a size line or a trailer line
                j = data.find(b"\n", i)
                if j < 0:
                    self.head += data[i:]
                    if len(self.head) > MAX_HEAD:
                        raise ValueError("a chunk-size or trailer line too long")
                    i = n
                    break
                line = (self.head + data[i:j]).rstrip(b"\r")
                self.head = b""
                i = j + 1
                if self.state == "size":
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        self.state = "trailer"
                    else:
                        self.state, self.need = "data", size
                elif not line:  # the empty line after the trailers
                    self.done = True
        return out, i


class Proxy:
    """`await Proxy(upstream).serve("127.0.0.1", 8081)` returns the asyncio server (see ProxyServer)."""

    def __init__(self, upstream: str, *, tap: Callable[[RequestInfo], object] | None = None,
                 connect_timeout: float = 10.0, max_idle: int = 64):
        u = urllib.parse.urlsplit(upstream)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"upstream must be http://HOST[:PORT] or https://...: {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/").encode()
        default = (u.scheme == "http" and self.port == 80) or (u.scheme == "https" and self.port == 443)
        self.host_header = (self.host if default else f"{self.host}:{self.port}").encode()
        self.tap = tap
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._idle: list = []
        self.n_requests = 0
        self.n_disconnects = 0  # clients that left before their answer was complete
        self.n_upstream_errors = 0
        self.tap_errors: list[str] = []  # recorder errors (the traffic went on); the last 20

    async def serve(self, host: str = "127.0.0.1", port: int = 8081) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: _ClientProtocol(self), host, port)

    # ------------------------------------------------------------------ upstream connections

    async def _connect(self):
        ctx = _ssl.create_default_context() if self.scheme == "https" else None
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=ctx, server_hostname=self.host if ctx else None,
                                    limit=MAX_HEAD), self.connect_timeout)

    def _take_idle(self):
        while self._idle:
            r, w = self._idle.pop()
            if not r.at_eof() and not w.is_closing():
                return r, w
            w.close()
        return None

    def _give_back(self, conn) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn[1].close()

    async def aclose(self) -> None:
        for _, w in self._idle:
            w.close()
        self._idle.clear()

    # ------------------------------------------------------------------ one client connection

    async def _client_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        proto = writer.transport.get_protocol()
        try:
            loop = asyncio.get_running_loop()
            while True:
                idle = loop.call_later(KEEP_ALIVE, writer.transport.close)  # an idle client is let go
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    writer.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
                    return
                finally:
                    idle.cancel()
                t0 = time.perf_counter()
                if not await self._one(head, t0, reader, writer, proto):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the proxy is stopping: end this connection quietly
            return
        finally:
            writer.close()

    async def _one(self, head: bytes, t0: float, reader, writer, proto) -> bool:
        """Forward one request; True when the client connection stays open for the next."""
        self.n_requests += 1
        try:
            first, headers = _parse_head(head[:-4])
            method, target, version = first.split(b" ", 2)
        except ValueError:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        conn_tokens = _tokens(headers, b"connection")
        keep = (b"close" not in conn_tokens) if version == b"HTTP/1.1" else (b"keep-alive" in conn_tokens)
        clen = _get(headers, b"content-length")
        if clen is not None and (not clen.isdigit() or int(clen) > MAX_BODY):
            writer.write(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        if b"100-continue" in _tokens(headers, b"expect"):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it before sending the body
        if b"chunked" in _tokens(headers, b"transfer-encoding"):
            parts: list = []
            await _read_chunked(reader, parts, None)
            body = b"".join(parts)
            if len(body) > MAX_BODY:
                writer.write(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return False
        else:
            n = int(clen or 0)
            body = await reader.readexactly(n) if n else b""
        fwd = [h for h in headers if h[0].lower() not in REQUEST_DROP]
        path, _, query = target.partition(b"?")
        rec = None
        if self.tap is not None:
            try:
                rec = self.tap(RequestInfo(t0, method.decode("latin-1"), path.decode("latin-1"),
                                           query.decode("latin-1"), [(k.lower(), v) for k, v, _ in fwd], body))
            except Exception as exc:  # a recorder bug must not break the traffic: noted
                self._tap_failed(exc)
        out = [method, b" ", self.prefix + target, b" HTTP/1.1\r\nHost: ", self.host_header, b"\r\n"]
        for _, _, raw in fwd:
            out += [raw, b"\r\n"]
        if body or method in (b"POST", b"PUT", b"PATCH"):
            out += [b"Content-Length: ", str(len(body)).encode(), b"\r\n"]
        out += [b"\r\n", body]
        request = b"".join(out)
        try:
            up, status_line, rheaders = await self._exchange(request, proto)
        except _ClientGone:
            self.n_disconnects += 1
            if rec is not None:
                self._safe(rec.done, 499, [], True)
            return False
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                _Closed) as exc:
            self.n_upstream_errors += 1
            msg = json.dumps({"error": {"code": 502, "type": "proxy_error", "message":
                              f"slotlab proxy: the upstream {self.upstream} did not answer: {type(exc).__name__}: {exc}"}}
                             ).encode()
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(msg)).encode() + b"\r\n" + (b"" if keep else b"Connection: close\r\n") + b"\r\n" + msg)
            if rec is not None:
                self._safe(rec.done, 502, [], False)
            return keep
        status = int(status_line.split(b" ", 2)[1])
        te = _tokens(rheaders, b"transfer-encoding")
        clen = _get(rheaders, b"content-length")
        no_body = method == b"HEAD" or status in (204, 304) or 100 <= status < 200
        if no_body:
            framing = "none"
        elif b"chunked" in te:
            framing = "chunked"
        elif clen is not None:
            framing = "length"
        else:
            framing = "close"  # the body ends when the upstream closes: so must the client's connection
            keep = False
        up_keep = b"close" not in _tokens(rheaders, b"connection") and framing != "close"
        rh = [b"HTTP/1.1" + status_line[status_line.index(b" "):], b"\r\n"]
        for k, _, raw in rheaders:
            if k.lower() not in RESPONSE_DROP:
                rh += [raw, b"\r\n"]
        if not keep:
            rh.append(b"Connection: close\r\n")
        rh.append(b"\r\n")
        writer.write(b"".join(rh))
        r_up, w_up = up
        cancelled = broken = False
        try:
            if framing == "length":
                await self._copy_length(r_up, writer, int(clen), rec)
            elif framing == "chunked":
                await self._copy_chunked(r_up, writer, rec)
            elif framing == "close":
                await self._copy_close(r_up, writer, rec)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.LimitOverrunError):
            if not proto.gone:  # the upstream broke off mid-answer: so does the proxy (the answer stays incomplete)
                broken = True
                self.n_upstream_errors += 1
        finally:
            proto.on_gone = None
        if proto.gone:  # the client left before the end (its upstream connection was closed at once)
            cancelled, broken = True, False
        if cancelled or broken or not up_keep:
            w_up.close()
        else:
            self._give_back(up)
        if cancelled:
            self.n_disconnects += 1
        if rec is not None:
            self._safe(rec.done, status, [(k.lower(), v) for k, v, _ in rheaders], cancelled)
        return keep and not cancelled and not broken

    async def _exchange(self, request: bytes, proto: _ClientProtocol):
        """Send the request on a pooled (or new) connection; read the response head. A pooled connection
        the upstream closed meanwhile (no byte of an answer came) is retried once on a new one. From the
        moment the request is sent, a client that leaves closes the upstream connection."""
        for attempt in (0, 1):
            conn = self._take_idle() if attempt == 0 else None
            fresh = conn is None
            if conn is None:
                conn = await self._connect()
            r, w = conn
            if proto.gone:
                w.close()
                raise _ClientGone()
            proto.on_gone = w.close
            try:
                w.write(request)
                while True:
                    head = await r.readuntil(b"\r\n\r\n")
                    status_line, rheaders = _parse_head(head[:-4])
                    code = int(status_line.split(b" ", 2)[1])
                    if 100 <= code < 200 and code != 101:
                        continue  # an interim answer: the real one follows
                    return conn, status_line, rheaders
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                proto.on_gone = None
                w.close()
                if proto.gone:
                    raise _ClientGone() from None
                if fresh or getattr(exc, "partial", b""):
                    raise _Closed(f"the upstream closed the connection ({type(exc).__name__})") from None
            except BaseException:
                proto.on_gone = None
                w.close()
                raise
        raise _Closed("the upstream closed the connection")  # pragma: no cover

    async def _copy_length(self, r_up, writer, n: int, rec) -> None:
        while n > 0:
            data = await r_up.read(min(n, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", n)
            n -= len(data)
            writer.write(data)
            if rec is not None:
                self._safe(rec.body, data)
            await writer.drain()

    async def _copy_close(self, r_up, writer, rec) -> None:
        while True:
            data = await r_up.read(1 << 16)
            if not data:
                return
            writer.write(data)
            if rec is not None:
                self._safe(rec.body, data)
            await writer.drain()

    async def _copy_chunked(self, r_up, writer, rec) -> None:
        """Copy a chunked body as it arrives, framing and all, one read at a time (the framing is
        followed by a scanner, not awaited chunk by chunk)."""
        sc = _ChunkScanner()
        while not sc.done:
            data = await r_up.read(1 << 16)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            pieces, used = sc.feed(data)
            writer.write(data if used == len(data) else data[:used])
            if rec is not None:
                for piece in pieces:
                    self._safe(rec.body, piece)
            await writer.drain()

    # ------------------------------------------------------------------ the tap's errors

    def _tap_failed(self, exc: BaseException) -> None:
        self.tap_errors.append(f"{type(exc).__name__}: {exc}")
        del self.tap_errors[:-20]

    def _safe(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # the recorder must never break the traffic (noted in tap_errors)
            self._tap_failed(exc)
