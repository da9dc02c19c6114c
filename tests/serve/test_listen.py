"""`slotlab serve --host A,B`: one listener per address, as llama-server (server-http.cpp) binds them;
and the Jinja string concatenation a template like firefunction-v2 relies on."""

from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

from slotlab.engine.params import ServerParams
from slotlab.errors import ConfigError
from slotlab.serve.jinja_env import make_environment
from slotlab.serve.listen import bind_all, format_host


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_host_flag_is_a_comma_separated_list():
    p = ServerParams.from_args(["--host", " 127.0.0.1 , ::1,"])
    assert p.hostnames == ("127.0.0.1", "::1")
    assert ServerParams.from_args([]).hostnames == ("127.0.0.1",)
    assert p.to_args() == ["--host", "127.0.0.1,::1"]
    with pytest.raises(ConfigError, match="--host requires at least one address"):
        ServerParams.from_args(["--host", " , "])


def test_the_environment_host_is_overwritten_with_the_servers_warning():
    p = ServerParams.from_args(["--host", "127.0.0.1"], env={"LLAMA_ARG_HOST": "192.0.2.1"})
    assert p.hostnames == ("127.0.0.1",)
    assert p.notes == ("warn: LLAMA_ARG_HOST environment variable is set, but will be overwritten by command "
                       "line argument --host",)
    assert ServerParams.from_args(["--host", "127.0.0.1"], env={}).notes == ()


def test_port_zero_with_several_tcp_addresses_is_refused():
    with pytest.raises(ConfigError, match="--port 0 is not supported with multiple TCP addresses"):
        bind_all(("127.0.0.1", "localhost"), 0)


def test_an_address_that_cannot_bind_is_the_servers_error():
    port = _free_port()
    with pytest.raises(ConfigError, match=f"couldn't bind HTTP server socket, hostname: 192.0.2.1, port: {port}"):
        bind_all(("127.0.0.1", "192.0.2.1"), port)
    socks, _ = bind_all(("127.0.0.1",), port)  # the first listener was closed again
    socks[0].close()


def test_unix_socket_path(tmp_path):
    path = str(tmp_path / "s.sock")
    socks, addresses = bind_all((path,), 8080)
    try:
        assert socks[0].family == socket.AF_UNIX and addresses == [f"unix://{path}"]
    finally:
        socks[0].close()


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
def test_every_address_answers():
    import uvicorn

    async def app(scope, receive, send):
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = _free_port()
    socks, addresses = bind_all(("127.0.0.1", "::1"), port)
    assert addresses == [f"http://127.0.0.1:{port}", f"http://[::1]:{port}"]
    assert socks[1].getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, kwargs={"sockets": socks}, daemon=True)
    t.start()
    try:
        for host in ("127.0.0.1", "::1"):
            for _ in range(100):
                try:
                    conn = http.client.HTTPConnection(host, port, timeout=5)
                    conn.request("GET", "/health")
                    r = conn.getresponse()
                    break
                except OSError:
                    time.sleep(0.05)
            assert (r.status, r.read()) == (200, b"ok"), host
    finally:
        server.should_exit = True
        t.join(10)
        for s in socks:
            s.close()
    assert format_host("::1") == "[::1]" and format_host("localhost") == "localhost"


def test_string_plus_undefined_is_the_string():
    """runtime.cpp: null/undefined concatenate with a string as "" (firefunction-v2 adds `functions`,
    which no llama.cpp chat handler defines any more); other arithmetic on undefined still fails."""
    env = make_environment()
    assert env.from_string("{{ 'a' + nothing + 'b' }}").render() == "ab"
    assert env.from_string("{% set s = 'x' %}{% set s = s + '\\n' + functions %}{{ s }}|").render() == "x\n|"
    with pytest.raises(Exception):
        env.from_string("{{ nothing + 1 }}").render()
