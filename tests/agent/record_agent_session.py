"""Record the agent session (tests/agent/scenario.py) through `slotlab proxy --record` in front of the
reference llama-server, as a user would: the real openai and anthropic SDKs, the proxy given the
server's flags. Writes tests/golden/agent/:

* `session.jsonl`: the proxy's session log (its header line: the flags, the server's /props);
* `server.log`: the server's own log (`slotlab watch --log` reads its cache_n / prompt_n per task);
* `truth.json`: what the driver did, call by call (conversation, turn, API, the change and its message)
  — never read by the analysis, only by the tests that check it.

Run: `.venv/bin/python -m tests.agent.record_agent_session [--serve] [OUTDIR]` (`--serve`: in front of
`slotlab serve` instead, for a machine without the reference server)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

FLAGS = ["-c", "8192", "-np", "2", "--cache-ram", "256"]
OUT = Path(__file__).resolve().parents[1] / "golden" / "agent"


def record(out: Path, serve: bool = False) -> list:
    from slotlab.llama.model import default_model_path
    from slotlab.proxy import ProxyServer
    from tests.agent.scenario import drive
    from tests.golden.llama_server import LlamaServer, slotlab_serve_command

    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    with LlamaServer(default_model_path(), FLAGS, log=log,
                     command=slotlab_serve_command() if serve else None) as srv:
        with ProxyServer(srv.url, record=out / "session.jsonl", flags=FLAGS) as px:
            sent = drive(px.url)
    (out / "truth.json").write_text(json.dumps({"flags": FLAGS, "server": "slotlab serve" if serve else "llama-server",
                                                "calls": [dataclasses.asdict(s) for s in sent]}, indent=1) + "\n")
    return sent


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--serve"]
    dest = Path(args[0]) if args else OUT
    if dest == OUT and dest.exists():
        shutil.rmtree(dest)
    sent = record(dest, serve="--serve" in sys.argv)
    print(f"{len(sent)} calls recorded in {dest}")
