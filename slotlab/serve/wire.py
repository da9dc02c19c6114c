"""The request head as llama-server's cpp-httplib reads it, in front of uvicorn's h11 parser.

h11 and cpp-httplib disagree on what a request is: h11 takes lowercase or invented methods, waits for
a chunked body when `Transfer-Encoding: chunked` comes with a `Content-Length` (the server refuses
that framing at once), requires one `Host`, refuses non-ASCII bytes in the target and any head over
16 KiB, where cpp-httplib (vendor/cpp-httplib/httplib.cpp, Server::process_request) has its own
rules. `check_head` applies cpp-httplib's rules to a complete head and either refuses it with the
server's status (an empty body, `Connection: close`: its error handler fills in only 404s) or hands
h11 a head rewritten into the form h11 reads the same way (one Host, one `Transfer-Encoding:
chunked`, the target's odd bytes percent-encoded, the fragment cut). `HttplibH11Protocol` is
uvicorn's h11 protocol with that gate on every request head that starts on an idle connection.

The rules, in the server's order:
- the request line ends with CRLF (a bare LF does not end a line; a NUL ends the C string), splits
  on spaces into exactly three words (runs of spaces and edge tabs are trimmed away), the method is
  one of GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH PRI (case-sensitive), the version
  HTTP/1.1 or HTTP/1.0; else 400. A request line over 32 KiB: the connection is closed unanswered.
- at most 100 header lines, each at most 8192 bytes with its CRLF, each `token ":" field-content`;
  differing `Content-Length` values; else 400.
- `Transfer-Encoding` with a non-zero `Content-Length`, or whose last coding is not `chunked`: 400.
- a target over 32768 bytes: 414 (llama.cpp raises httplib's 8192; a request line over 32 KiB is
  dropped first, so this cannot happen).
- a `Content-Length` that is not a number or overflows 64 bits (400), and
  a `Content-Encoding` httplib knows but is built without (gzip, deflate, br, zstd: 415), are the
  server's answers when it reads the body: after the key check and the route match, for POST, PUT,
  PATCH and DELETE or a body that is framed. The gate drops such a length (h11 would refuse it in
  its own words) and leaves a note; `body_error` gives the route the server's answer.
- an `Accept` list with an entry that is not a media range (or a bad `q=`): 400; a `Range` that is
  not `bytes=` ranges: 416.
The server goes on reading a connection after a refused request line (the rest of the head is read
as further requests, each answered 400); slotlab answers the first 400 and closes."""

from __future__ import annotations

import re

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "PRI"})
# methods httplib parses but has no routing branch for: 400 after the pre-routing handler (CORS, key)
UNROUTED = frozenset({"CONNECT", "TRACE", "PRI"})
REQUEST_URI_MAX = 32768  # CPPHTTPLIB_REQUEST_URI_MAX_LENGTH as llama.cpp builds httplib (vendor/cpp-httplib/CMakeLists.txt)
HEADER_MAX_LENGTH = 8192  # CPPHTTPLIB_HEADER_MAX_LENGTH (a line, its CRLF included)
HEADER_MAX_COUNT = 100  # CPPHTTPLIB_HEADER_MAX_COUNT
MAX_LINE_LENGTH = 32768  # CPPHTTPLIB_MAX_LINE_LENGTH
MAX_HEAD = MAX_LINE_LENGTH + HEADER_MAX_COUNT * HEADER_MAX_LENGTH + 4  # what h11 must be able to buffer
DROP = -1  # close without an answer
BODY_ERROR = b"X-Slotlab-Body-Error"  # the gate's note to the route: this body cannot be read

_TCHAR = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_PHRASES = {400: b"Bad Request", 413: b"Payload Too Large", 414: b"URI Too Long", 416: b"Range Not Satisfiable"}


def _is_vchar(c: int) -> bool:  # field-vchar: VCHAR or obs-text
    return 33 <= c <= 126 or c >= 128


def is_field_content(v: bytes) -> bool:
    """fields::is_field_content: vchars, with spaces / tabs allowed only inside."""
    if not v:
        return True
    if not _is_vchar(v[0]) or not _is_vchar(v[-1]):
        return False
    return all(c in (0x20, 0x09) or _is_vchar(c) for c in v[1:-1])


def _trim(b: bytes) -> bytes:
    return b.strip(b" \t")


def split(b: bytes, d: bytes) -> list[bytes]:
    """detail::split: the pieces between delimiters, trimmed of spaces and tabs, empty ones skipped."""
    return [p for p in (_trim(x) for x in b.split(d)) if p]


def parse_header(line: bytes):
    """detail::parse_header on a line without its CRLF: (name, value) or None."""
    line = line.rstrip(b" \t")
    name, sep, value = line.partition(b":")
    if not _TCHAR.match(name) or not sep:
        return None
    value = value.lstrip(b" \t")
    return (name, value) if is_field_content(value) else None


def _is_numeric(v: bytes) -> bool:
    return bool(v) and v.isdigit()


def _u64(v: bytes | None, default: int = 0) -> int:
    """get_header_value_u64: a non-numeric value is the default, one that overflows is SIZE_MAX."""
    if v is None or not _is_numeric(v):
        return default
    n = int(v)
    return n if n < 2**64 else 2**64 - 1


def _media_type(s: bytes) -> bytes:
    """detail::extract_media_type: the part before ';', trimmed."""
    return _trim(s.split(b";", 1)[0])


def _quality_ok(entry: bytes) -> bool:
    """parse_quality: a token before ';' and, in the first `q=` parameter, a value whose leading
    `1*DIGIT ["." *DIGIT]` (httplib's own from_chars: no sign, no exponent) is in [0, 1]."""
    token, _, params = entry.partition(b";")
    if not _trim(token):
        return False
    for p in params.split(b";") if params else []:
        if len(p) < 2 or p[:1] not in (b"q", b"Q") or p[1:2] != b"=":
            continue
        v = _trim(p[2:])
        m = re.match(rb"\d*(\.\d*)?", v)
        if not v or not m or not re.search(rb"\d", m.group()):
            return False
        return float(m.group() if m.group() != b"." else b"0") <= 1.0
    return True


def accept_ok(s: bytes) -> bool:
    """detail::parse_accept_header."""
    for entry in split(s, b","):
        if not _quality_ok(entry):
            return False
        mt = _media_type(_trim(entry.split(b";", 1)[0]))
        if not mt or (mt != b"*" and b"/" not in mt):
            return False
    return True


def range_ok(s: bytes) -> bool:
    """detail::parse_range_header."""
    if not (len(s) > 7 and s.startswith(b"bytes=")):
        return False
    ranges = 0
    for r in split(s[6:], b","):
        lhs, dash, rhs = r.partition(b"-")
        if not dash or not all(c in b"0123456789" for c in lhs + rhs):
            return False
        first = int(lhs) if lhs else -1
        if first >= 2**63:
            return False
        last = int(rhs) if rhs and int(rhs) < 2**63 else -1
        if (first == -1 and last == -1) or (first != -1 and last != -1 and first > last):
            return False
        ranges += 1
    return ranges > 0


def is_chunked(te_values: list[bytes]) -> bool:
    """detail::is_chunked_transfer_encoding: the last coding of the last line is `chunked`."""
    last = b""
    for v in te_values:
        pieces = split(v, b",")
        last = pieces[-1] if pieces else b""
    return last.lower() == b"chunked"


def _fix_target(target: bytes) -> bytes:
    """The target as h11 takes it: the fragment cut (httplib skips it), bytes outside VCHAR
    percent-encoded (httplib decodes the path, so the route is the same)."""
    target = target.split(b"#", 1)[0]
    return b"".join(bytes([c]) if 33 <= c <= 126 else b"%%%02X" % c for c in target)


def check_head(head: bytes) -> tuple[int, bytes]:
    """A complete head (request line to the empty line, CRLFs included): (0, the head for h11) or
    (status, b"") to refuse with; DROP: close without an answer."""
    lines = head.split(b"\r\n")
    assert lines[-2:] == [b"", b""] or head == b"\r\n", head[-8:]
    request_line = lines[0]
    if len(request_line) + 2 > MAX_LINE_LENGTH:
        return DROP, b""
    if b"\0" in request_line:  # strlen(): the line ends at the NUL, without its CRLF
        return 400, b""
    words = split(request_line, b" ")
    if len(words) != 3:
        return 400, b""
    method, target, version = words
    if method.decode("latin-1") not in METHODS or version not in (b"HTTP/1.1", b"HTTP/1.0"):
        return 400, b""
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:-2]:
        if len(line) + 2 > HEADER_MAX_LENGTH or len(headers) >= HEADER_MAX_COUNT:
            return 400, b""
        h = parse_header(line)
        if h is None:
            return 400, b""
        headers.append(h)
    by = {}
    for k, v in headers:
        by.setdefault(k.lower(), []).append(v)
    cls = by.get(b"content-length", [])
    if any(v != cls[0] for v in cls):
        return 400, b""
    te = by.get(b"transfer-encoding")
    if te is not None and (_u64(cls[0] if cls else None) > 0 or not is_chunked(te)):
        return 400, b""
    if len(target) > REQUEST_URI_MAX:
        return 414, b""
    if b"accept" in by and not accept_ok(b", ".join(v for v in by[b"accept"] if v)):
        return 400, b""
    if b"range" in by and not range_ok(by[b"range"][0]):
        return 416, b""
    body_error = b""  # read_content's verdict on a length h11 cannot take: answered by the route (body_error)
    if cls and te is None and (not _is_numeric(cls[0]) or int(cls[0]) >= 2**64):
        framed = _is_numeric(cls[0])  # has_framed_body: a length that parses (SIZE_MAX on overflow) > 0
        body_error = b"400 " + (b"framed" if framed else b"unframed")
    out = [method + b" " + _fix_target(target) + b" " + version]
    seen_host = seen_cl = False
    for k, v in headers:
        lk = k.lower()
        if lk == b"host":
            if seen_host:
                continue  # h11 refuses a second Host; httplib reads the first
            seen_host = True
        elif lk in (b"transfer-encoding", b"content-length"):
            if te is not None or (lk == b"content-length" and (seen_cl or body_error)):
                continue  # framing re-written below / an equal Content-Length once
            seen_cl = seen_cl or lk == b"content-length"
        out.append(k + b": " + v)
    if te is not None:
        out.append(b"Transfer-Encoding: chunked")
    if body_error:
        out.append(BODY_ERROR + b": " + body_error)
    if not seen_host and version == b"HTTP/1.1":
        out.append(b"Host: localhost")  # h11 needs one; httplib does not look at it
    return 0, b"\r\n".join(out) + b"\r\n\r\n"


def refusal(status: int) -> bytes:
    """cpp-httplib's answer to a refused head: the status, no body, the connection closed."""
    return (b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Length: 0\r\nServer: llama.cpp\r\n\r\n"
            % (status, _PHRASES.get(status, b"")))


def head_end(buf: bytes) -> int:
    """The length of the head at the start of `buf` (through its empty line), 0 while incomplete."""
    if buf.startswith(b"\r\n"):
        return 2  # an empty request line: refused by the line's own check
    i = buf.find(b"\r\n\r\n")
    return i + 4 if i >= 0 else 0


def incomplete_verdict(buf: bytes) -> int:
    """For a head still coming: 0 to wait, or what the server does once a line outgrows its limit."""
    first = buf.find(b"\r\n")
    if first < 0:
        return DROP if len(buf) > MAX_LINE_LENGTH else 0
    rest = buf[first + 2:]
    lines = rest.split(b"\r\n")
    if len(lines[-1]) > HEADER_MAX_LENGTH or len(lines) - 1 > HEADER_MAX_COUNT:
        return 400
    return 0


class HttplibH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with `check_head` in front: on an idle connection the bytes of a new
    request are held until its head is complete, judged by cpp-httplib's rules, and then either
    answered as the server answers a refused head or passed to h11 rewritten. Bytes that arrive
    while a request is in progress (its body, a pipelined request) go to h11 as they are."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._head = b""
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]:
            super().data_received(data)
            return
        buf = self._head + data
        end = head_end(buf)
        if not end:
            verdict = incomplete_verdict(buf)
            if verdict == 0:
                self._head = buf
                return
            self._refuse(verdict)
            return
        self._head = b""
        status, head = check_head(buf[:end])
        if status:
            self._refuse(status)
            return
        super().data_received(head + buf[end:])

    def eof_received(self):
        """The client closed its side: a head still pending is read as it is (httplib's getline
        returns the partial line), so it is refused with a 400."""
        if self._head and not self._refused:
            self._refuse(400)
            return None
        return super().eof_received()

    def _refuse(self, status: int) -> None:
        self._refused = True
        self._unset_keepalive_if_required()
        if status != DROP:
            self.transport.write(refusal(status))
        self.transport.close()


class Unrouted:
    """CONNECT, TRACE and PRI pass cpp-httplib's parser but have no routing branch: after the
    pre-routing handler (CORS, the API key) they are a 400 with no body."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] in UNROUTED:
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-length", b"0"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


def uvicorn_options() -> dict:
    """The uvicorn.Config arguments that put this gate in front of h11."""
    return {"http": HttplibH11Protocol, "h11_max_incomplete_event_size": MAX_HEAD}


def body_error(scope) -> int | None:
    """The status the server answers a matched route with when it reads this request's body (and
    cannot), or None: the gate's length note, else an unsupported `Content-Encoding` (415)."""
    method = scope["method"]
    note = coding = b""
    te = False
    for k, v in scope["headers"]:
        lk = k.lower()
        if lk == BODY_ERROR.lower():
            note = v
        elif lk == b"content-encoding" and v:
            coding = coding + b", " + v if coding else v
        elif lk == b"transfer-encoding":
            te = True
    if note:
        status, _, framing = note.partition(b" ")
        if method in ("POST", "PUT", "PATCH", "DELETE") or framing == b"framed":
            return int(status)
        return None
    if coding.lower() in (b"gzip", b"deflate", b"br", b"zstd"):
        cl = next((v for k, v in scope["headers"] if k.lower() == b"content-length"), b"")
        if method in ("POST", "PUT", "PATCH", "DELETE") or te or _u64(cl) > 0:
            return 415
    return None
