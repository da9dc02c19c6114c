"""The listening sockets of `slotlab serve`, bound as llama-server binds them (server-http.cpp
server_http_context::init / start): one listener per `--host` address, a comma-separated list; an
address ending in `.sock` is a UNIX socket path; with more than one TCP address an IPv6 listener is
IPv6-only (`::` must not also claim 0.0.0.0) and `--port 0` is refused. A failed bind is the server's
"couldn't bind HTTP server socket" error. All the sockets are served by one uvicorn server, on one
event loop."""

from __future__ import annotations

import os
import socket

from slotlab.errors import ConfigError


def format_host(host: str) -> str:
    """common_http_format_host: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def _bind_tcp(host: str, port: int, v6only: bool) -> socket.socket:
    """cpp-httplib bind_to_port: getaddrinfo(host, port, AF_UNSPEC, SOCK_STREAM, AI_PASSIVE), the first
    address that binds."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except socket.gaierror:
        infos = []
    for family, stype, proto, _, addr in infos:
        sock = socket.socket(family, stype, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if v6only else 0)
            sock.bind(addr)
            sock.set_inheritable(True)
            return sock
        except OSError:
            sock.close()
    raise OSError(f"cannot bind {host}:{port}")


def _bind_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if os.path.exists(path):
            os.unlink(path)  # cpp-httplib removes a stale socket file before binding
        sock.bind(path)
        return sock
    except OSError:
        sock.close()
        raise


def bind_all(hosts: tuple[str, ...] | list[str], port: int) -> tuple[list[socket.socket], list[str]]:
    """Bind every address; returns the sockets and the addresses as the server's "listening on" lines
    name them (http://HOST:PORT, http://[V6]:PORT, unix://PATH). Raises ConfigError, with llama-server's
    error text, when an address cannot be bound (the sockets bound so far are closed)."""
    n_tcp = sum(not h.endswith(".sock") for h in hosts)
    if port == 0 and n_tcp > 1:
        raise ConfigError("--port 0 is not supported with multiple TCP addresses")
    socks: list[socket.socket] = []
    addresses: list[str] = []
    for host in hosts:
        try:
            if host.endswith(".sock"):
                socks.append(_bind_unix(host))
                addresses.append(f"unix://{host}")
                continue
            sock = _bind_tcp(host, port, v6only=n_tcp > 1)
            socks.append(sock)
            if port == 0:
                port = sock.getsockname()[1]  # bind_to_any_port: the port the system chose
            addresses.append(f"http://{format_host(host)}:{port}")
        except OSError:
            for s in socks:
                s.close()
            raise ConfigError(f"couldn't bind HTTP server socket, hostname: {host}, port: {port}") from None
    return socks, addresses


def run_uvicorn(app, socks: list[socket.socket], *, log_level: str = "warning") -> None:
    """Serve `app` on every socket, with one uvicorn server (one event loop) whose HTTP parser reads
    request heads as cpp-httplib does (slotlab.serve.wire); returns when it stops (Ctrl-C / SIGTERM)."""
    import uvicorn

    from slotlab.serve.wire import uvicorn_options

    config = uvicorn.Config(app, log_level=log_level, lifespan="off", **uvicorn_options())
    server = uvicorn.Server(config)
    try:
        server.run(sockets=socks)
    finally:
        for s in socks:
            s.close()
