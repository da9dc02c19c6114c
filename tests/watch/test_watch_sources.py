"""A live watch's sources, without a model (seconds): a followed log file (appended, rotated by rename,
truncated in place, created late, a partial last line, a huge line), a child process's output, a
server restart in the log (a new server life: the old RAM cache is evicted with reason `restart`), the
poller (/props, /slots, /metrics; down and up again), `Panel(watch)`, and `slotlab watch` live from the
command line."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from slotlab.cli import main
from slotlab.engine import event_types as T
from slotlab.panel import Panel
from slotlab.watch import Watch
from slotlab.watch.follow import MAX_LINE, ChildProcess, FileFollower
from slotlab.watch.log_reader import LogReader, requests_json

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"
GOLDEN = DIR / "defaults_chat_checkpoints.llama-server.log"


def golden_lines(name: str = "defaults_chat_checkpoints") -> list[bytes]:
    return (DIR / f"{name}.llama-server.log").read_bytes().splitlines(True)


def want(name: str = "defaults_chat_checkpoints") -> list[dict]:
    return requests_json(LogReader().read_file(DIR / f"{name}.llama-server.log"))


# ------------------------------------------------------------------ the file follower

def test_follower_survives_rotation_truncation_and_a_late_file(tmp_path):
    p = tmp_path / "server.log"
    f = FileFollower(p)
    assert f.poll() == [] and "waiting" in f.notes[-1]
    p.write_bytes(b"a\nb\npartial")
    assert f.poll() == [b"a\n", b"b\n"]
    with open(p, "ab") as fh:
        fh.write(b" line\nc\n")
    assert f.poll() == [b"partial line\n", b"c\n"]
    os.rename(p, tmp_path / "server.log.1")  # logrotate: rename, then the server writes a new file
    with open(tmp_path / "server.log.1", "ab") as fh:
        fh.write(b"last of old\n")
    p.write_bytes(b"new 1\n")
    assert f.poll() == [b"last of old\n", b"new 1\n"] and f.n_rotations == 1
    p.write_bytes(b"x\n")  # truncated in place (copytruncate) and written again
    assert f.poll() == [b"x\n"] and f.n_truncations == 1
    with open(p, "ab") as fh:
        fh.write(b"y" * (MAX_LINE + 10) + b"\nz\n")
    got = f.poll()
    assert len(got[0]) == MAX_LINE + 1 and got[1:] == [b"z\n"]
    f.close()


def test_follower_from_the_end(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes(b"old\n")
    f = FileFollower(p, from_start=False)
    with open(p, "ab") as fh:
        fh.write(b"new\n")
    assert f.poll() == [b"new\n"]


def test_child_output_in_order_and_its_exit(tmp_path):
    script = "import sys\nfor i in range(3):\n    print(i, flush=True)\nprint('err', file=sys.stderr)\nsys.exit(3)"
    c = ChildProcess([sys.executable, "-c", script], tee=tmp_path / "out.log")
    c.start()
    deadline = time.monotonic() + 20
    while c.exited() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.exited() == 3
    assert c.poll() == [b"0\n", b"1\n", b"2\n", b"err\n"]
    assert (tmp_path / "out.log").read_bytes() == b"0\n1\n2\nerr\n"


# ------------------------------------------------------------------ the watch

def test_a_followed_log_through_a_rotation_gives_every_request(tmp_path):
    p = tmp_path / "server.log"
    lines = golden_lines()
    with Watch(p) as w:
        panel = Panel(w)
        half = len(lines) // 2
        with open(p, "ab") as fh:
            fh.writelines(lines[:half])
        assert w.wait_for(lambda: w.reader.n_lines == half, 10)
        os.rename(p, tmp_path / "server.log.1")
        p.write_bytes(b"".join(lines[half:]))
        assert w.wait_for(lambda: w.reader.n_lines == len(lines), 10)
    assert w.results() == want()
    panel.refresh()
    assert panel.state.n_requests == len(want()) and "rotated 1x" in panel.header.value
    assert "token counts and positions only" in panel.header.value
    kinds = {e.kind for e in w.events.log}
    assert {T.CHECKPOINT_RESTORED, T.CACHE_LOADED, T.CACHE_ALLOC} <= kinds
    assert any("was rotated" in e.message for e in w.events.log)


def test_a_restart_in_the_log_begins_a_new_life(tmp_path):
    p = tmp_path / "server.log"
    lines = golden_lines("cache_ram_fifo_bytes")
    p.write_bytes(b"".join(lines + lines))  # the server was restarted and logged into the same file
    with Watch(p) as w:
        assert w.wait_for(lambda: w.reader.n_lines == len(lines), 10)
    first = want("cache_ram_fifo_bytes")
    assert w.n_lives == 2 and w.results() == first + first
    evs = w.events.replay().events
    gone = [e for e in evs if e.kind == T.CACHE_EVICT and e.payload.reason == "restart"]
    assert gone and all(e.seq < w.epochs[1] for e in gone)
    assert any(e.kind == T.LOG and "new server life" in e.message for e in evs)
    from slotlab.panel.state import PanelState

    mid = PanelState.rebuild([e for e in evs if e.seq < w.epochs[1]])
    assert mid.entries == {} and all(s.n_tokens == 0 for s in mid.slots.values())


def test_a_child_that_dies_is_shown_and_restarted(tmp_path):
    src = tmp_path / "golden.log"
    src.write_bytes(b"".join(golden_lines("example")))
    script = (f"import sys, time\nfor ln in open({str(src)!r}, 'rb'):\n    sys.stdout.buffer.write(ln)\n"
              "sys.stdout.flush()\ntime.sleep(2.2)\nsys.exit(7)")
    with Watch(command=[sys.executable, "-c", script], restarts=1) as w:
        panel = Panel(w)
        assert w.wait_for(lambda: w.n_lives == 2, 20)
        assert w.wait_for(lambda: w.state.startswith("exited"), 20)
    panel.refresh()
    assert w.exit_codes == [7, 7] and w.results() == want("example") * 2
    assert "exited with code 7" in panel.events_box.value
    assert "server lives: 2 (exit codes [7, 7])" in panel.header.value


# ------------------------------------------------------------------ the poller

class _Server:
    """A stand-in for llama-server's /props, /slots, /metrics (stdlib http.server)."""

    def __init__(self, port: int = 0):
        self.metrics = {"prompt_tokens_total": 100, "tokens_predicted_total": 10, "n_decode_total": 5}
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/props":
                    body = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
                elif self.path == "/slots":
                    body = [{"id": 0, "n_ctx": 4096, "is_processing": True, "id_task": 7, "n_prompt_tokens": 120,
                             "n_prompt_tokens_cache": 100, "n_prompt_tokens_processed": 20,
                             "next_token": [{"n_decoded": 3}]}, {"id": 1, "n_ctx": 4096, "is_processing": False}]
                elif self.path == "/metrics":
                    text = "".join(f"# TYPE llamacpp:{k} counter\nllamacpp:{k} {v}\n" for k, v in outer.metrics.items())
                    data = text.encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_poller_fills_in_and_sees_the_server_go_and_come_back(tmp_path):
    srv = _Server()
    url = f"http://127.0.0.1:{srv.port}"
    p = tmp_path / "server.log"
    p.write_bytes(b"")  # a log with no start-up lines (attached to a running server)
    with Watch(p, url=url, poll=0.1) as w:
        w._t_start -= 5  # the start-up lines had their chance
        assert w.wait_for(lambda: any(e.kind == T.INIT for e in w.events.log), 5)
        init = next(e for e in w.events.log if e.kind == T.INIT)
        assert (init.payload.n_slots, init.payload.n_ctx_slot) == (2, 4096) and "GET /props" in init.message
        lines = w.status_lines()
        assert any("slot 0: processing, task 7: 120 tokens, 100 cached + 20 processed, 3 generated" in s for s in lines)
        assert any("slot 1: idle" in s for s in lines)
        srv.stop()
        assert w.wait_for(lambda: w.server.up is False, 5)
        assert "DOWN" in w.panel_note()
        srv = _Server(srv.port)
        srv.metrics["n_decode_total"] = 1  # a new process: its counters start again
        assert w.wait_for(lambda: w.server.up and w.server.n_restarts == 1, 5)
    msgs = [e.message for e in w.events.log if e.kind == T.LOG]
    assert any("does not answer" in m for m in msgs) and any("answers again" in m for m in msgs)
    assert any("was restarted" in m for m in msgs)
    srv.stop()


def test_panel_controls_on_a_watch(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes(b"".join(golden_lines("example")))
    with Watch(p) as w:
        panel = Panel(w)
        panel.b_step.click()
        assert "cannot be paused or stepped" in panel.status.value
        panel.b_clear.click()
        assert "no endpoint that clears" in panel.status.value
        panel.b_send.click()
        assert "no --url" in panel.status.value


# ------------------------------------------------------------------ the command line

def test_cli_follows_a_log(tmp_path, capsys):
    p = tmp_path / "server.log"
    lines = golden_lines()

    def write():
        for i in range(0, len(lines), 50):
            with open(p, "ab") as fh:
                fh.writelines(lines[i:i + 50])
            time.sleep(0.05)

    th = threading.Thread(target=write)
    th.start()
    assert main(["watch", "--follow", "--log", str(p), "--duration", "3", "--json"]) == 0
    th.join()
    out = json.loads(capsys.readouterr().out)
    assert out["results"] == want() and out["flags"][:2] == ["-np", "4"]


def test_cli_runs_a_command_and_ends_with_it(tmp_path, capsys):
    src = tmp_path / "golden.log"
    src.write_bytes(b"".join(golden_lines("example")))
    script = f"import sys\nsys.stdout.buffer.write(open({str(src)!r}, 'rb').read())"
    assert main(["watch", "--duration", "60", "--", sys.executable, "-c", script]) == 0
    out = capsys.readouterr().out
    assert "exited with code 0" in out and f"{len(want('example'))} requests seen" in out
    assert "cache_n" in out  # the live lines


def test_cli_live_needs_a_url_for_the_twin(capsys):
    assert main(["watch", "--twin", "--log", "x.log"]) == 1
    assert "--twin needs --url" in capsys.readouterr().err


def test_command_flags_for_the_twin():
    from slotlab.watch.cli import command_flags

    cmd = ["llama-server", "-m", "m.gguf", "--host", "127.0.0.1", "--port", "8080", "-t", "2", "-lv", "4",
           "--no-webui", "-np", "2", "--api-key=k", "--cache-ram", "64"]
    assert command_flags(cmd) == ["-m", "m.gguf", "-np", "2", "--cache-ram", "64"]


def test_cli_usage_errors(capsys):
    with pytest.raises(SystemExit):
        main(["watch"])  # nothing to watch
    assert "--log FILE is needed" in capsys.readouterr().err
    assert main(["watch", "--follow"]) == 1
    assert "a watch needs a log file, a command to start, or a server URL" in capsys.readouterr().err


def test_command_flags_of_other_servers():
    from slotlab.watch.cli import command_flags

    assert command_flags(["/usr/bin/python3", "-m", "slotlab.watch.serve_log", "-m", "m.gguf", "--port", "1", "-np",
                          "2"]) == ["-m", "m.gguf", "-np", "2"]
    assert command_flags(["slotlab", "serve", "-c", "4096"]) == ["-c", "4096"]


def test_command_url():
    from slotlab.watch.cli import command_url

    assert command_url(["llama-server", "-m", "m"]) == ("http://127.0.0.1:8080", None)
    assert command_url(["llama-server", "--host", "0.0.0.0", "--port=9000", "--api-key", "k"]) == \
        ("http://127.0.0.1:9000", "k")
