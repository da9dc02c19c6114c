"""Run the reference llama-server (see bench/build_llama_server.py) for recording golden data.

Only the recorders use this; the tests read the recorded JSON, so they run without the server."""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.build_llama_server import server_binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slotlab_serve_command() -> list[str]:
    """`slotlab serve` as a drop-in for the llama-server binary."""
    import sys

    return [sys.executable, "-m", "slotlab.cli", "serve"]


class LlamaServer:
    """`with LlamaServer(model_path, ["-np", "2"]) as srv: srv.post("/completion", {...})`"""

    def __init__(self, model: str | Path, flags: list[str], threads: int = 2, log: Path | None = None,
                 command: list[str] | None = None):
        if command is None:
            binary = server_binary()
            if binary is None:
                raise RuntimeError("llama-server is not built: run `make llama-server`")
            command = [str(binary)]
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.cmd = [*command, "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                    "--no-repack", "-t", str(threads), "--no-webui", *flags]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LlamaServer":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 600  # a loaded host can take minutes to load even the small model
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                if self.get("/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()  # never leave the server running behind the error
        raise RuntimeError(f"llama-server did not become healthy; log: {self.log_path}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 300):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def get(self, path: str):
        return self._request("GET", path)

    def post(self, path: str, body: dict | None = None, timeout: float = 300):
        return self._request("POST", path, body or {}, timeout)
