"""A differential fuzz of the HTTP edge: a deterministic generator of raw requests over classes
(authentication, encodings, limits, header syntax, duplicate headers, routes, methods, framing,
JSON oddities, field types), sent as bytes on a socket, and the answer as a client sees it.

Both servers run with FLAGS (an API key among them). `tests/serve/record_bad_input.py --fuzz`
sends every case to the real llama-server and writes golden_bad_input_fuzz.json (each case's name,
a digest of its bytes, and the answer: status, JSON or text body, Access-Control-Allow-Origin);
tests/serve/test_bad_input.py regenerates the cases, checks the digests and requires slotlab serve's
answers to be the same. What is compared is chosen per case: the whole answer for errors and for
answers that cannot depend on the CPU, the status and the body's keys for a generation.

The generator is the specification: every class draws its variants from lists, and a seeded
`random.Random` mixes fields, values and endpoints, so a change to it changes the digests and asks
for a new recording."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import time

KEY = "fuzz-key-20"
FLAGS = ["-np", "2", "-c", "2048", "--metrics", "--api-key", KEY]  # + --slot-save-path DIR
AUTH = b"Authorization: Bearer " + KEY.encode()
CHAT = [{"role": "user", "content": "hi"}]
SEED = 20


def request(method: str, path: str, body: bytes | str | None = None, headers: list | None = None,
            auth: bool = True, version: str = "HTTP/1.1", content_length: bool = True) -> bytes:
    """A request's bytes: the request line, the key (unless `auth` is False), `headers` (bytes lines
    or (name, value) pairs), Content-Length for a body, and the body."""
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {path} {version}".encode() if isinstance(path, str) else method.encode() + b" " + path +
             b" " + version.encode(), b"Host: 127.0.0.1"]
    if auth:
        lines.append(AUTH)
    for h in headers or []:
        lines.append(h if isinstance(h, bytes) else h[0].encode() + b": " + (h[1] if isinstance(h[1], bytes) else h[1].encode()))
    if body is not None:
        lines.append(b"Content-Type: application/json")
        if content_length:
            lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


class _Cases:
    def __init__(self):
        self.out: list[dict] = []
        self.names: set[str] = set()

    def add(self, cls: str, name: str, raw: bytes, compare: str = "body", **kw) -> None:
        name = f"{cls}: {name}"
        assert name not in self.names, name
        self.names.add(name)
        self.out.append({"name": name, "class": cls, "raw": raw, "compare": compare, **kw})


def _auth(c: _Cases) -> None:
    k = KEY.encode()
    tok = _j({"content": "hi"})
    variants = [
        ("no key", []), ("Bearer key", [b"Authorization: Bearer " + k]), ("bare key", [b"Authorization: " + k]),
        ("lowercase bearer", [b"Authorization: bearer " + k]), ("two spaces", [b"Authorization: Bearer  " + k]),
        ("Bearer glued", [b"Authorization: Bearer" + k]), ("wrong key", [b"Authorization: Bearer nope"]),
        ("key with a suffix", [b"Authorization: Bearer " + k + b"x"]), ("key prefix", [b"Authorization: Bearer " + k[:-1]]),
        ("trailing spaces trimmed", [b"Authorization: Bearer " + k + b"   "]), ("tab before", [b"Authorization:\tBearer " + k]),
        ("X-Api-Key", [b"X-Api-Key: " + k]), ("X-Api-Key with Bearer", [b"X-Api-Key: Bearer " + k]),
        ("x-api-key lowercase name", [b"x-api-key: " + k]), ("AUTHORIZATION upper name", [b"AUTHORIZATION: Bearer " + k]),
        ("empty Authorization falls back", [b"Authorization: ", b"X-Api-Key: " + k]),
        ("wrong Authorization wins over X-Api-Key", [b"Authorization: Bearer nope", b"X-Api-Key: " + k]),
        ("two Authorization, good first", [b"Authorization: Bearer " + k, b"Authorization: Bearer nope"]),
        ("two Authorization, good second", [b"Authorization: Bearer nope", b"Authorization: Bearer " + k]),
        ("two X-Api-Key, good first", [b"X-Api-Key: " + k, b"X-Api-Key: nope"]),
        ("two X-Api-Key, good second", [b"X-Api-Key: nope", b"X-Api-Key: " + k]),
        ("empty then good Authorization", [b"Authorization: ", b"Authorization: Bearer " + k]),
        ("key not UTF-8", [b"Authorization: Bearer caf\xe9"]), ("key UTF-8", ["Authorization: Bearer caf\u00e9".encode()]),
        ("User-Agent not UTF-8", [AUTH, b"User-Agent: caf\xe9"]), ("Origin not UTF-8", [AUTH, b"Origin: http://caf\xe9"]),
        ("other header not UTF-8, no key", [b"X-Thing: \xff\xfe"]),
        ("60 KB key", [b"Authorization: Bearer " + b"k" * 60000]),
        ("key in query string", []),
    ]
    for name, hs in variants:
        path = "/tokenize?api_key=" + KEY if name == "key in query string" else "/tokenize"
        c.add("auth", name, request("POST", path, tok, hs, auth=False))
    for path in ("/health", "/v1/health", "/", "/props", "/metrics", "/slots", "/v1/models", "/nope", "/index.html",
                 "/sw.js", "/health/"):
        c.add("auth", f"GET {path} without a key", request("GET", path, auth=False),
              compare="status" if path in ("/metrics", "/props", "/v1/models") else "body")
    c.add("auth", "OPTIONS without a key", request("OPTIONS", "/completion", auth=False,
                                                   headers=[("Origin", "http://a.example")]))


def _limits(c: _Cases) -> None:
    for n in (8186, 8187, 8188, 8189):  # the header line's length with its CRLF: n + 5
        c.add("limits", f"header line of {n + 5} bytes", request("GET", "/health", headers=[b"X: " + b"a" * n]))
    c.add("limits", "Authorization line of 8192 bytes", request("POST", "/tokenize", _j({"content": "a"}), auth=False,
                                                                 headers=[b"Authorization: Bearer " + b"k" * 8168]))
    c.add("limits", "Authorization line of 8193 bytes", request("POST", "/tokenize", _j({"content": "a"}), auth=False,
                                                                 headers=[b"Authorization: Bearer " + b"k" * 8169]))
    c.add("limits", "header of 20 KB", request("GET", "/health", headers=[b"X-Big: " + b"b" * 20000]))
    c.add("limits", "header of 40 KB", request("GET", "/health", headers=[b"X-Big: " + b"b" * 40000]))
    c.add("limits", "many 8 KB headers (120 KB)", request("GET", "/health", headers=[b"X-%d: " % i + b"c" * 8000
                                                                                        for i in range(15)]))
    # Host and Authorization are two lines of the count
    for n in (97, 98, 99):
        c.add("limits", f"{n + 2} header lines", request("GET", "/health", headers=[b"X-%d: y" % i for i in range(n)]))
    for n in (8192, 8193, 32767, 32768, 32769):  # the request line's length with its CRLF
        path = "/health?" + "q" * (n - 8 - len("GET  HTTP/1.1\r\n"))
        c.add("limits", f"request line of {n} bytes", request("GET", path))
    c.add("limits", "request line of 40 KB", request("GET", "/health?" + "q" * 40000))
    c.add("limits", "body of 1 MB", request("POST", "/tokenize", _j({"content": "a", "pad": "p" * 1000000})),
          compare="body")


def _headers(c: _Cases) -> None:
    hs = [
        ("space before colon", b"X-A : b"), ("no colon", b"X-A b"), ("empty name", b": b"),
        ("name with a slash", b"X/A: b"), ("name with a non-ASCII byte", b"X\xe9: b"),
        ("obs-fold continuation", b"X-A: b\r\n c"), ("control byte in value", b"X-A: b\x01c"),
        ("DEL in value", b"X-A: b\x7fc"), ("NUL in value", b"X-A: b\x00c"), ("tab inside value", b"X-A: b\tc"),
        ("only spaces value", b"X-A:    "), ("bare LF inside a line", b"X-A: b\nX-B: c"),
        ("bare CR inside a value", b"X-A: b\rc"), ("obs-text value", b"X-A: \x80\xff"),
        ("value with quotes and commas", b'X-A: "a, b", c'), ("very short", b"X:"),
    ]
    for name, h in hs:
        c.add("headers", name, request("POST", "/tokenize", _j({"content": "a"}), headers=[h]))
    c.add("headers", "Accept text/plain", request("GET", "/health", headers=[("Accept", "text/plain")]))
    for v in ("text", "*", "*/*;q=0.5", "text/html;q=2", "text/html;q=abc", "text/html;q=", "a/b, , c/d", ";q=1",
              "text/html;level=1;q=0.3", "text/html;Q=1", "text/html;q=-0", "a/b;q=.5", "a/b;q=0.5x", "a/b;q=1e0",
              "a/b;q=1.0001", "a/b;x=1;q=0;q=5"):
        c.add("headers", f"Accept {v!r}", request("GET", "/health", headers=[("Accept", v)]))
    for v in ("bytes=0-1", "bytes=1-0", "bytes=-5", "bytes=abc", "items=0-1", "bytes=", "bytes=0-1,3-4", "bytes=5-"):
        c.add("headers", f"Range {v!r}", request("GET", "/health", headers=[("Range", v)]))
    c.add("headers", "Expect 100-continue", request("POST", "/tokenize", _j({"content": "a"}),
                                                    headers=[("Expect", "100-continue")]))
    c.add("headers", "Expect something else", request("POST", "/tokenize", _j({"content": "a"}),
                                                      headers=[("Expect", "teapot")]))
    c.add("headers", "Connection close", request("GET", "/health", headers=[("Connection", "close")]))
    c.add("headers", "Content-Type text/plain", request("POST", "/tokenize", _j({"content": "a"}),
                                                        headers=[("Content-Type", "text/plain")]))
    c.add("headers", "Content-Encoding gzip (not built in)", request("POST", "/tokenize", _j({"content": "a"}),
                                                                     headers=[("Content-Encoding", "gzip")]))
    c.add("headers", "Content-Encoding identity", request("POST", "/tokenize", _j({"content": "a"}),
                                                          headers=[("Content-Encoding", "identity")]))
    for origin in ("http://a.example", "null", ""):
        c.add("headers", f"Origin {origin!r}", request("GET", "/health", headers=[("Origin", origin)]))


def _duplicates(c: _Cases) -> None:
    body = _j({"content": "a"})
    n = str(len(body)).encode()
    c.add("duplicates", "two equal Content-Length", request("POST", "/tokenize", body, content_length=False,
                                                             headers=[b"Content-Length: " + n] * 2))
    c.add("duplicates", "two different Content-Length", request("POST", "/tokenize", body, content_length=False,
                                                                 headers=[b"Content-Length: " + n, b"Content-Length: 1"]))
    c.add("duplicates", "Content-Length list in one line", request("POST", "/tokenize", body, content_length=False,
                                                                    headers=[b"Content-Length: " + n + b", " + n]))
    c.add("duplicates", "two Host", request("GET", "/health", headers=[("Host", "b.example")]))
    c.add("duplicates", "two Origin", request("GET", "/health", headers=[("Origin", "http://one.example"),
                                                                        ("Origin", "http://two.example")]))
    c.add("duplicates", "two Content-Type", request("POST", "/tokenize", body, headers=[("Content-Type", "text/plain")]))
    c.add("duplicates", "two Transfer-Encoding chunked", request("POST", "/tokenize", _chunked(body), content_length=False,
                                                                 headers=[b"Transfer-Encoding: chunked"] * 2))
    c.add("duplicates", "Transfer-Encoding gzip then chunked lines", request(
        "POST", "/tokenize", _chunked(body), content_length=False,
        headers=[b"Transfer-Encoding: gzip", b"Transfer-Encoding: chunked"]))


def _chunked(body: bytes, sizes=(5,)) -> bytes:
    out, i, k = b"", 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        out += b"%x\r\n" % len(body[i:i + n]) + body[i:i + n] + b"\r\n"
        i += n
        k += 1
    return out + b"0\r\n\r\n"


def _framing(c: _Cases) -> None:
    body = _j({"content": "hello"})
    te = b"Transfer-Encoding: chunked"
    c.add("framing", "chunked", request("POST", "/tokenize", _chunked(body), content_length=False, headers=[te]))
    c.add("framing", "chunked, uppercase coding", request("POST", "/tokenize", _chunked(body), content_length=False,
                                                           headers=[b"Transfer-Encoding: CHUNKED"]))
    c.add("framing", "chunked + Content-Length", request("POST", "/tokenize", _chunked(body), content_length=False,
                                                          headers=[te, b"Content-Length: %d" % len(body)]))
    c.add("framing", "chunked + Content-Length 0", request("POST", "/tokenize", _chunked(body), content_length=False,
                                                            headers=[te, b"Content-Length: 0"]))
    c.add("framing", "Content-Length then chunked", request("POST", "/tokenize", body, content_length=False,
                                                             headers=[b"Content-Length: %d" % len(body), te]))
    for coding in ("gzip", "gzip, chunked", "chunked, gzip", "identity", "chunked;x=1", ""):
        payload = _chunked(body) if coding.endswith("chunked") else body
        c.add("framing", f"Transfer-Encoding {coding!r}", request(
            "POST", "/tokenize", payload, content_length=False, headers=[b"Transfer-Encoding: " + coding.encode()]))
    for v in ("abc", "-1", "+5", "1.5", "99999999999999999999999", " "):
        c.add("framing", f"Content-Length {v!r}", request("POST", "/tokenize", body, content_length=False,
                                                           headers=[b"Content-Length: " + v.encode()]))
    c.add("framing", "Content-Length longer than the body, closed", request(
        "POST", "/tokenize", body, content_length=False, headers=[b"Content-Length: %d" % (len(body) + 50)]),
        half_close=True)
    c.add("framing", "Content-Length shorter than the body", request(
        "POST", "/tokenize", body, content_length=False, headers=[b"Content-Length: %d" % (len(body) - 3)]))
    c.add("framing", "no Content-Length on a POST", request("POST", "/tokenize", body, content_length=False),
          half_close=True)
    c.add("framing", "GET with a body", request("GET", "/health", b"xyz"))
    for v in ("abc", "99999999999999999999999"):
        c.add("framing", f"GET with Content-Length {v!r}", request("GET", "/health", headers=[b"Content-Length: " + v.encode()]))
    for path, auth in (("/nope", True), ("/tokenize", False)):
        c.add("framing", f"bad Content-Length on {path}" + ("" if auth else " without a key"), request(
            "POST", path, body, auth=auth, content_length=False, headers=[b"Content-Length: abc"]))
    for coding in ("gzip", "deflate", "br", "zstd", "gzip, identity", "x-gzip", "UTF-8"):
        c.add("framing", f"Content-Encoding {coding!r}", request("POST", "/tokenize", body,
                                                                 headers=[b"Content-Encoding: " + coding.encode()]))
    c.add("framing", "Content-Encoding gzip on a GET", request("GET", "/health", headers=[b"Content-Encoding: gzip"]))
    c.add("framing", "Content-Encoding gzip without a key", request("POST", "/tokenize", body, auth=False,
                                                                    headers=[b"Content-Encoding: gzip"]))
    for line in (b"GET /health HTTP/1.0", b"GET /health HTTP/2.0", b"GET /health HTTP/1.2", b"GET /health http/1.1",
                 b"GET /health", b"GET", b"GET  /health  HTTP/1.1", b"GET /health HTTP/1.1 extra",
                 b"GET\t/health HTTP/1.1", b" GET /health HTTP/1.1", b"GET /health HTTP/1.1 ", b"GET /he alth HTTP/1.1",
                 b"GET /health\x00 HTTP/1.1", b"GET /h\x01ealth HTTP/1.1", b"GET /health\t HTTP/1.1",
                 b"GET /health#frag HTTP/1.1", b"GET http://127.0.0.1/health HTTP/1.1", b"GET * HTTP/1.1",
                 b"GET health HTTP/1.1", b""):
        c.add("framing", f"request line {line!r}", line + b"\r\nHost: x\r\n" + AUTH + b"\r\n\r\n")
    c.add("framing", "bare LF line ends", b"GET /health HTTP/1.1\nHost: x\n\n", half_close=True)
    for line in (b"FOO /health HTTP/1.1", b"GET /health HTTP/3", b"get /health HTTP/1.1"):
        c.add("framing", f"every answer to {line!r}", line + b"\r\nHost: x\r\n" + AUTH + b"\r\n\r\n", all=True)
    c.add("framing", "every answer to a good request", request("GET", "/health"), all=True)
    c.add("framing", "leading empty line", b"\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    c.add("framing", "HTTP/1.0 without Host", b"GET /health HTTP/1.0\r\n\r\n")
    c.add("framing", "HTTP/1.1 without Host", b"GET /health HTTP/1.1\r\n\r\n")
    c.add("framing", "head cut off, closed", b"GET /health HTTP/1.1\r\nHost: x\r\n", half_close=True)
    c.add("framing", "nothing, closed", b"", half_close=True)


ROUTES_GET = ["/health", "/v1/health", "/props", "/models", "/v1/models", "/slots", "/metrics", "/lora-adapters",
              "/v1/stream", "/cors-proxy", "/tools", "/sw.js"]
ROUTES_POST = ["/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
               "/v1/chat/completions/control", "/v1/responses", "/responses", "/v1/audio/transcriptions",
               "/audio/transcriptions", "/v1/messages", "/infill", "/embedding", "/embeddings", "/v1/embeddings",
               "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/tokenize", "/detokenize", "/apply-template",
               "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens", "/responses/input_tokens",
               "/v1/responses/input_tokens", "/v1/messages/count_tokens", "/lora-adapters", "/slots/0", "/props",
               "/v1/streams/lookup", "/cors-proxy", "/tools"]


def _routes(c: _Cases) -> None:
    for p in ROUTES_GET:
        c.add("routes", f"GET {p}", request("GET", p),
              compare="status" if p in ("/props", "/models", "/v1/models", "/metrics", "/slots") else "body")
    for p in ROUTES_POST:
        c.add("routes", f"POST {p} with an empty object", request("POST", p, b"{}"))
        c.add("routes", f"POST {p} with broken JSON", request("POST", p, b"{"))
    for p in ("/completion/", "//completion", "/Completion", "/completion.json", "/%63ompletion", "/completion%2F",
              "/v1//chat/completions", "/./completion", "/v1/../completion", "/tokenize?x=1", "/tokenize?", "/tokenize#x",
              "/tokenize;x"):
        c.add("routes", f"POST {p}", request("POST", p, _j({"content": "a"})))
    for p in ("/slots/", "/slots/0/", "/slots/--1", "/slots/+1", "/slots/-0", "/slots/%31", "/slots/1e1", "/slots/ 1",
              "/slots/0x1", "/slots/00", "/slots/2147483648", "/slots/a/b"):
        c.add("routes", f"POST {p}?action=erase", request("POST", p.replace(" ", "%20") + "?action=erase", b"{}"))
    for q in ("action=erase&action=save", "action=ERASE", "action=", "action=erase%00", "Action=erase"):
        c.add("routes", f"POST /slots/0?{q}", request("POST", "/slots/0?" + q, b"{}"))
    for p in ("/v1/health", "/health"):
        c.add("routes", f"POST {p}", request("POST", p, b"{}"))


def _methods(c: _Cases) -> None:
    for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PRI", "FOO", "get",
              "Get", "PROPFIND", "M-SEARCH", "G\xe9T"):
        for p, auth in (("/health", True), ("/completion", True), ("/nope", True), ("/completion", False)):
            raw = request(m.encode("latin-1").decode("latin-1"), p, b"{}" if m in ("POST", "PUT", "PATCH") else None,
                          auth=auth)
            if not m.isascii():
                raw = raw.replace(m.encode(), m.encode("latin-1"), 1)
            c.add("methods", f"{m} {p}" + ("" if auth else " without a key"), raw)
    c.add("methods", "CONNECT authority form", b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n\r\n")
    c.add("methods", "OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n")


def _json(c: _Cases) -> None:
    """Bodies nlohmann and Python read differently: on /tokenize (the parsed value is visible in its
    answer), /completion and /slots (a 500 outside the handler's try)."""
    bodies = [
        ("BOM", b'\xef\xbb\xbf{"content": "a"}'), ("half a BOM", b'\xef\xbb{"content": "a"}'),
        ("BOM then space", b'\xef\xbb\xbf {"content": "a"}'), ("two BOMs", b'\xef\xbb\xbf\xef\xbb\xbf{"content": "a"}'),
        ("NUL then garbage", b'{"content": "a"}\x00garbage'), ("NUL first", b'\x00{"content": "a"}'),
        ("NUL inside", b'{"content": \x00"a"}'), ("garbage after", b'{"content": "a"} x'),
        ("trailing whitespace", b'{"content": "a"} \t\r\n'), ("form feed whitespace", b'{"content":\x0c"a"}'),
        ("deep nesting ignored", b'{"content": "a", "x": ' + b"[" * 10000 + b"]" * 10000 + b"}"),
        ("deep objects ignored", b'{"content": "a", "x": ' + b'{"a":' * 3000 + b"1" + b"}" * 3000 + b"}"),
        ("5000 unclosed [", b"[" * 5000), ("5000 unclosed { keys", b'{"a":' * 5000),
        ("deep nesting content", b'{"content": ' + b"[" * 2000 + b"]" * 2000 + b"}"),
        ("1e400", b'{"content": "a", "x": 1e400}'), ("-1e400", b'{"content": "a", "x": -1e400}'),
        ("1e-400", b'{"content": [1e-400]}'), ("1E308", b'{"content": "a", "x": 1E308}'),
        ("400-digit int", b'{"content": "a", "x": ' + b"9" * 400 + b"}"),
        ("300-digit int", b'{"content": "a", "x": ' + b"9" * 300 + b"}"),
        ("5000-digit int", b'{"content": "a", "x": ' + b"7" * 5000 + b"}"),
        ("2^64 token", b'{"content": [18446744073709551616]}'), ("2^64-1 token", b'{"content": [18446744073709551615]}'),
        ("-2^63 token", b'{"content": [-9223372036854775808]}'), ("-2^63-1 token", b'{"content": [-9223372036854775809]}'),
        ("-0 token", b'{"content": [-0]}'), ("leading zero", b'{"content": [01]}'), ("plus sign", b'{"content": [+1]}'),
        ("dot number", b'{"content": [.5]}'), ("exponent without digits", b'{"content": [1e]}'),
        ("hex number", b'{"content": [0x10]}'), ("NaN", b'{"content": [NaN]}'), ("Infinity", b'{"content": [Infinity]}'),
        ("duplicate key, last wins", b'{"content": "a", "content": "b c"}'),
        ("invalid UTF-8 in a string", b'{"content": "caf\xe9"}'), ("continuation byte alone", b'{"content": "\x80"}'),
        ("overlong encoding", b'{"content": "\xc0\xaf"}'), ("surrogate in UTF-8", b'{"content": "\xed\xa0\x80"}'),
        ("F5 byte", b'{"content": "\xf5\x80\x80\x80"}'), ("truncated sequence", b'{"content": "\xe2\x82"}'),
        ("valid 4-byte", '{"content": "\U0001f600"}'.encode()), ("invalid UTF-8 in a key", b'{"caf\xe9": 1}'),
        ("invalid UTF-8 outside strings", b'{"content": "a"\xe9}'),
        ("lone high surrogate escape", b'{"content": "\\ud800"}'), ("lone low surrogate escape", b'{"content": "\\udc00"}'),
        ("surrogate pair escape", b'{"content": "\\ud83d\\ude00"}'), ("high then not low", b'{"content": "\\ud800\\u0041"}'),
        ("bad escape", b'{"content": "\\x41"}'), ("short unicode escape", b'{"content": "\\u41"}'),
        ("NUL escape", b'{"content": "a\\u0000b"}'), ("raw tab in a string", b'{"content": "a\tb"}'),
        ("raw newline in a string", b'{"content": "a\nb"}'), ("raw DEL in a string", b'{"content": "a\x7fb"}'),
        ("raw US in a string", b'{"content": "a\x1fb"}'),
        ("error after multibyte text", '{"content": "\u00e9\u00e9\u00e9\u00e9", x}'.encode()),
        ("error on line 3", b'{\n"content":\n x}'), ("error after CRLF", b'{\r\n"content": x}'),
        ("single quotes", b"{'content': 'a'}"), ("comment", b'{"content": "a" /* c */}'),
        ("trailing comma", b'{"content": "a",}'), ("empty", b""), ("spaces only", b"   "),
        ("UTF-16 body", '{"content": "a"}'.encode("utf-16")), ("true literal cut", b'{"content": tru}'),
        ("array body", b'["a"]'), ("string body", b'"a"'), ("number body", b"1"),
    ]
    for name, b in bodies:
        c.add("json", f"/tokenize {name}", request("POST", "/tokenize", b))
    for name, b in bodies[::3]:
        c.add("json", f"/completion {name}", request("POST", "/completion", b), compare="keys")
    for name, b in bodies[1::5]:
        c.add("json", f"/slots save {name}", request("POST", "/slots/0?action=save", b), compare="keys")


# field types: every field below gets values of every type class
FIELDS = ["n_predict", "temperature", "stream", "seed", "stop", "grammar", "json_schema", "grammar_triggers",
          "grammar_lazy", "preserved_tokens", "reasoning_format", "chat_format", "t_max_predict_ms", "n_probs",
          "logit_bias", "samplers", "response_fields", "id_slot", "cache_prompt", "n_indent", "lora", "n_cmpl",
          "dry_sequence_breakers", "mirostat", "top_k", "min_p", "typical_p", "penalty_last_n", "ignore_eos",
          "return_tokens", "post_sampling_probs", "timings_per_token", "n_keep", "n_discard", "tool_choice",
          "parse_tool_calls", "reasoning_budget_tokens", "generation_prompt", "chat_parser", "echo"]
VALUES = [("string", "x"), ("empty string", ""), ("int", 1), ("zero", 0), ("negative", -2), ("float", 0.5),
          ("huge", 1e300), ("true", True), ("false", False), ("null", None), ("empty array", []),
          ("array", ["a"]), ("empty object", {}), ("object", {"a": 1})]


def _fields(c: _Cases) -> None:
    rng = random.Random(SEED)
    base = {"prompt": "hi", "n_predict": 0, "temperature": 0}
    for f in FIELDS:
        for vname, v in rng.sample(VALUES, 3):
            c.add("fields", f"/completion {f} {vname}", request("POST", "/completion", _j({**base, f: v})),
                  compare="keys")
    for name, extra in (("t_max_predict_ms false", {"t_max_predict_ms": False}),
                        ("t_max_predict_ms true", {"t_max_predict_ms": True}),
                        ("grammar_triggers word", {"grammar_triggers": [{"type": 1, "value": "zz"}]}),
                        ("grammar_triggers token without token", {"grammar_triggers": [{"type": 0, "value": "a"}]}),
                        ("grammar_triggers without type", {"grammar_triggers": [{"value": "a"}]}),
                        ("grammar_triggers a string", {"grammar_triggers": "x"}),
                        ("grammar_lazy without triggers", {"grammar_lazy": True, "grammar": "root ::= \"a\""}),
                        ("reasoning_format bogus", {"reasoning_format": "bogus"}),
                        ("reasoning_format deepseek-legacy", {"reasoning_format": "deepseek-legacy"}),
                        ("chat_format 4", {"chat_format": 4}), ("chat_format 5", {"chat_format": 5}),
                        ("chat_format -1", {"chat_format": -1}), ("tool_choice bogus", {"tool_choice": "bogus"}),
                        ("json_schema integer minimum above maximum", {"json_schema": {"type": "integer", "minimum": 5,
                                                                                        "maximum": 1}}),
                        ("json_schema empty enum", {"json_schema": {"enum": []}}),
                        ("json_schema false", {"json_schema": False}),
                        ("json_schema bad type", {"json_schema": {"type": "nope"}}),
                        ("json_schema nested bad type", {"json_schema": {"type": "object", "properties": {
                            "a": {"type": "nope"}}}}),
                        ("json_schema bad $ref", {"json_schema": {"$ref": "#/defs/x"}}),
                        ("json_schema $ref elsewhere", {"json_schema": {"$ref": "http://x/y"}}),
                        ("json_schema enum a string", {"json_schema": {"enum": "a"}}),
                        ("json_schema properties an array", {"json_schema": {"type": "object", "properties": []}}),
                        ("json_schema minLength negative", {"json_schema": {"type": "string", "minLength": -1}}),
                        ("json_schema type array empty", {"json_schema": {"type": []}}),
                        ("json_schema anyOf empty", {"json_schema": {"anyOf": []}})):
        c.add("fields", f"/completion case {name}", request("POST", "/completion", _j({**base, **extra})),
              compare="keys")
    chat = {"messages": CHAT, "max_tokens": 0}
    for f in ("tool_choice", "tools", "response_format", "json_schema", "grammar", "chat_template_kwargs",
              "reasoning_format", "parallel_tool_calls", "add_generation_prompt", "continue_final_message",
              "reasoning_effort", "logprobs", "top_logprobs", "n", "stop", "stream_options"):
        for vname, v in rng.sample(VALUES, 2):
            c.add("fields", f"chat {f} {vname}", request("POST", "/v1/chat/completions", _j({**chat, f: v})),
                  compare="keys")
    for name, extra in (("tool_choice bogus", {"tool_choice": "bogus"}), ("tool_choice none", {"tool_choice": "none"}),
                        ("tool_choice required", {"tool_choice": "required"}),
                        ("tool_choice a function", {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
                        ("json_schema unsatisfiable", {"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}}),
                        ("json_schema empty enum", {"json_schema": {"enum": []}}),
                        ("json_schema bad type", {"json_schema": {"type": "nope"}}),
                        ("json_schema string", {"json_schema": "x"}), ("json_schema bad $ref", {"json_schema": {"$ref": "#/x"}}),
                        ("response_format json_object", {"response_format": {"type": "json_object"}}),
                        ("response_format json_schema string", {"response_format": {"type": "json_schema",
                                                                                     "json_schema": "x"}}),
                        ("response_format text", {"response_format": {"type": "text"}}),
                        ("grammar broken", {"grammar": "root ::= ("}), ("grammar unknown rule", {"grammar": "root ::= x"}),
                        ("grammar_triggers list", {"grammar_triggers": [{"type": 0, "value": "a"}]}),
                        ("reasoning_format bogus", {"reasoning_format": "bogus"}),
                        ("reasoning_format deepseek", {"reasoning_format": "deepseek"}),
                        ("chat_format 999", {"chat_format": 999}), ("chat_format -1", {"chat_format": -1})):
        c.add("fields", f"chat case {name}", request("POST", "/v1/chat/completions", _j({**chat, **extra})), compare="keys")
    msgs = [("role number", [{"role": 1, "content": "hi"}]), ("role null", [{"role": None, "content": "hi"}]),
            ("role array", [{"role": ["user"], "content": "hi"}]), ("role unknown", [{"role": "wizard", "content": "hi"}]),
            ("text part text number", [{"role": "user", "content": [{"type": "text", "text": 1}]}]),
            ("text part without text", [{"role": "user", "content": [{"type": "text"}]}]),
            ("text part type number", [{"role": "user", "content": [{"type": 1, "text": "a"}]}]),
            ("part a string", [{"role": "user", "content": ["hi"]}]),
            ("tool_calls a string", [*CHAT, {"role": "assistant", "tool_calls": "x"}]),
            ("tool_calls a list of strings", [*CHAT, {"role": "assistant", "tool_calls": ["x"]}]),
            ("tool_calls function not an object", [*CHAT, {"role": "assistant", "tool_calls": [{"type": "function",
                                                                                                   "function": "f"}]}]),
            ("tool_calls name a number", [*CHAT, {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": 1, "arguments": "{}"}}]}]),
            ("tool_calls arguments an object", [*CHAT, {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]),
            ("content a number", [{"role": "user", "content": 5}]), ("content an object", [{"role": "user", "content": {}}]),
            ("name a number", [{"role": "user", "content": "hi", "name": 5}]),
            ("reasoning_content a number", [*CHAT, {"role": "assistant", "content": "a", "reasoning_content": 5}]),
            ("tool_call_id a number", [*CHAT, {"role": "tool", "content": "a", "tool_call_id": 5}]),
            ("message a string", ["hi"]), ("message null", [None]), ("messages empty", []),
            ("messages an object", {"role": "user", "content": "hi"})]
    for name, m in msgs:
        c.add("fields", f"chat messages {name}", request("POST", "/v1/chat/completions", _j({"messages": m, "max_tokens": 0})),
              compare="keys")
        c.add("fields", f"apply-template messages {name}", request("POST", "/apply-template", _j({"messages": m})))
    tools = [("tools a string", "x"), ("tool without function", [{"type": "function"}]),
             ("tool function a string", [{"type": "function", "function": "f"}]),
             ("tool name a number", [{"type": "function", "function": {"name": 1}}]),
             ("tool parameters a string", [{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
             ("tool type other", [{"type": "code"}])]
    for name, t in tools:
        c.add("fields", f"apply-template {name}", request("POST", "/apply-template", _j({"messages": CHAT, "tools": t})))


def cases() -> list[dict]:
    c = _Cases()
    for gen in (_auth, _limits, _headers, _duplicates, _framing, _routes, _methods, _json, _fields):
        gen(c)
    for case in c.out:
        case["digest"] = hashlib.sha1(case["raw"]).hexdigest()[:16]
    return c.out


# ------------------------------------------------------------------------------------------ the client


def _read_response(sock: socket.socket, head_only: bool, deadline: float, buf: bytes = b"") -> dict:
    """One response from `sock` (`buf`: bytes already read); its "rest" is what came after it."""

    def more() -> bool:
        nonlocal buf
        sock.settimeout(max(0.05, deadline - time.time()))
        try:
            d = sock.recv(65536)
        except socket.timeout:
            raise TimeoutError from None
        except ConnectionResetError:
            d = b""
        buf += d
        return bool(d)

    try:
        while b"\r\n\r\n" not in buf:
            if not more():
                return {"status": "closed" if not buf else "bad answer"}
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            headers.setdefault(k.strip().lower().decode("latin-1"), v.strip().decode("latin-1"))
        buf = rest
        body = b""
        if head_only or status in (100, 204, 304):
            pass
        elif "content-length" in headers:
            n = int(headers["content-length"])
            while len(buf) < n and more():
                pass
            body = buf[:n]
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                while b"\r\n" not in buf:
                    if not more():
                        break
                line, _, buf = buf.partition(b"\r\n")
                n = int(line.split(b";")[0] or b"0", 16)
                if n == 0:
                    break
                while len(buf) < n + 2 and more():
                    pass
                body += buf[:n]
                buf = buf[n + 2:]
        else:
            while more():
                pass
            body = buf
    except TimeoutError:
        return {"status": "timeout"}
    rest = buf if status == 100 else buf[len(body):] if "content-length" in headers else b""
    return {"status": status, "body": body, "acao": headers.get("access-control-allow-origin"), "rest": rest}


def send(host: str, port: int, case: dict, timeout: float = 20.0) -> dict:
    """One case on a fresh connection: the first answer (a 100 Continue is skipped), as a client
    reads it: status ("closed": no answer, "timeout": none within `timeout`), the body as JSON (or
    text), and the Access-Control-Allow-Origin header."""
    deadline = time.time() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(case["raw"])
            if case.get("half_close"):
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        head_only = case["raw"].startswith(b"HEAD ")
        rest = b""
        while True:
            got = _read_response(sock, head_only, deadline, rest)
            rest = got.pop("rest", b"")
            if got["status"] != 100:
                break
        if case.get("all"):  # every answer the connection gives before it closes (or goes quiet)
            statuses, more = [got["status"]], dict(got)
            while isinstance(more["status"], int) and len(statuses) < 10:
                more = _read_response(sock, head_only, min(deadline, time.time() + 3), rest)
                rest = more.pop("rest", b"")
                if isinstance(more["status"], int):
                    statuses.append(more["status"])
            got["statuses"] = statuses
    body = got.pop("body", b"")
    if body:
        try:
            got["response"] = json.loads(body)
        except ValueError:
            got["response"] = body.decode("utf-8", "replace")
    else:
        got["response"] = None if got["status"] in ("closed", "timeout", "bad answer") else ""
    return got


def view(case: dict, answer: dict) -> dict:
    """What a case compares of an answer."""
    out = {"status": answer["status"], "acao": answer.get("acao")}
    if "statuses" in answer:
        out["statuses"] = answer["statuses"]
    r = answer.get("response")
    if case["compare"] == "body" or (case["compare"] == "keys" and answer["status"] != 200):
        out["response"] = r
    elif case["compare"] == "keys":
        out["keys"] = sorted(r) if isinstance(r, dict) else type(r).__name__
    return out


# Cases where the real server's answer is a fault slotlab does not copy: `server` says what the
# recorded answer is (checked against the golden), `slotlab` is slotlab's answer (README "Serve real
# traffic", docs/server-behaviour.md "The HTTP edge").
def _is(status, type_=None):
    def check(a):
        r = a.get("response")
        return a["status"] == status and (type_ is None or isinstance(r, dict) and r["error"]["type"] == type_)
    return check


_SLOTLAB_501 = "is not supported by slotlab (it models llama-server's slots and caches)"


def _slotlab_501(what: str) -> dict:
    return {"status": 501, "acao": "", "response": {"error": {
        "code": 501, "message": f"{what} {_SLOTLAB_501}", "type": "not_supported_error"}}}


DIVERGES: dict[str, dict] = {
    # a body cut short by the client's half-close: the server reads to the end and answers 400, uvicorn
    # sees the client gone and drops the request
    "framing: Content-Length longer than the body, closed": {"server": _is(400),
                                                             "slotlab": {"status": "closed", "acao": None,
                                                                         "response": None}},
    # a field slotlab does not model (context shift): its 501, not a silent acceptance
    "fields: /completion n_discard int": {"server": _is(200),
                                          "slotlab": _slotlab_501('the request field "n_discard"')},
    # the C++ schema reader takes a node with no keyword it knows as any value; llama-cpp-python's
    # Python converter, which slotlab uses, refuses it in its own words
    "fields: /completion json_schema object": {"server": _is(200), "slotlab": {
        "status": 400, "acao": "", "response": {"error": {"code": 400, "message": "Field 'json_schema': "
                                                          "\"json_schema\": Unrecognized schema: {'a': 1}",
                                                          "type": "invalid_request_error"}}}},
    # a well-formed schema no value satisfies: the server's sampler fails mid-generation with a 500
    # (its fault); slotlab's grammar lets the two-token answer through
    "fields: /completion case json_schema integer minimum above maximum": {"server": _is(500), "slotlab": _is(200)},
}
