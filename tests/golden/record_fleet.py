"""Record a fleet of real llama-servers behind a small real router (issue 35): the proof for
`slotlab simulate TRACE --fleet N --router R`.

    python -m tests.golden.record_fleet [--servers 2] [ROUTER ...]   # default: round-robin session prefix
    python -m tests.golden.record_fleet --servers 3                   # 3 servers, 4 conversations

For each router it starts N real llama-servers (the pin, build/llama-server/..., on the default
model) with the trace's flags plus `--no-repack -t 2 -lv 4`, starts `Router` in front of them (a
Python HTTP proxy in this process: a real HTTP hop that forwards each /completion body unchanged to
the server it chooses and returns that server's answer, naming the server in `X-Slotlab-Server`), and
sends the trace's requests to the router in order, each after the previous one was answered, as
`slotlab replay` sends them (greedy, ignore_eos). Into tests/golden/traces_fleet/:

* NAME.json: the trace in slotlab's format (flags, requests: prompt, n_predict) plus
  `"fleet": {"servers": N, "router": R}`: what `simulate_fleet` is run with;
* NAME.fleet.json: per request the router's choice (`server`) and that server's answer (the golden
  schema of record_traces: status, id_slot, cache_n, prompt_n, tokens_evaluated, tokens_cached,
  content), plus the router's own line per request (what it saw);
* NAME.server<k>.log: each server's -lv 4 log.

The traffic: N + 1 "chat over a document" conversations (3 for 2 servers, 4 for 3), each a distinct
document of over 1024 tokens followed by 4 question turns (each turn's prompt = the previous prompt + a
scripted answer + the next question), the turns interleaved (A1 B1 C1 A2 B2 C2 ...). N + 1
conversations over N servers make round-robin send a conversation's consecutive turns to different
servers (a turn re-prefills what that server never saw, or restores an older turn from its RAM cache);
session affinity and the prefix router keep a conversation on one server.

What the router sees is only the request as sent, and the same as the simulation's router reads off
the trace (slotlab.fleet.keys): the prompt's tokens, which it asks a backend's /tokenize for (as
KV-aware routers tokenize), BOS included as /completion adds it:

* round-robin: request k to server k mod N;
* session: the conversation key of a trace without conversation ids: a blake2b digest of the prompt's
  first 1024 token ids (int32 bytes), keyed ("tokens", digest), its repr hashed with blake2b, mod N;
* prefix: its own LRU index per server of 64-token blocks' chained keys; the longest indexed prefix
  if it covers more than half the blocks (ties: fewest sent, lowest number), else the smallest index.

Those are written out here from the definitions (not imported from slotlab), so a change in the
simulation's routers shows up against these recordings. The test (tests/fleet/test_fleet_golden.py)
runs from the committed files, without any server."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from tests.golden.record_traces import _request_result

OUT = Path(__file__).with_name("traces_fleet")
#: example.json's flags (2 slots, a unified KV, a 128 MiB RAM cache): a server holds two conversations
#: in its slots and more in its RAM cache
FLAGS = ["-np", "2", "-kvu", "-c", "4096", "--cache-ram", "128", "--swa-full"]
ROUTERS = ("round-robin", "session", "prefix")
SESSION_TOKENS = 1024
BLOCK_TOKENS = 64
CACHE_THRESHOLD = 0.5
INDEX_BLOCKS = 65_536

#: the conversations' documents (the first N + 1), chosen so that session affinity spreads them over
#: more than one server at N = 2 and N = 3
TOPICS = ("lighthouses", "glaciers", "volcanoes", "orchards")
QUESTIONS = ("What is the first point?", "Which section mentions the value 7?", "Summarise the last section.",
             "Name one more detail.")
ANSWER = "It is covered in the document."


def document(topic: str, n: int = 60) -> str:
    """A deterministic document of `n` sentences about `topic` (about 20 tokens a sentence: over 1024 tokens)."""
    return " ".join(f"Section {j} of the {topic} survey records item {j} with value {(j * 7 + len(topic)) % 13}."
                    for j in range(n))


def conversation_prompts(topic: str, turns: int) -> list[str]:
    out, text = [], f"Document about {topic}:\n{document(topic)}\n"
    for t in range(turns):
        text += f"User: {QUESTIONS[t % len(QUESTIONS)]}\nAssistant:"
        out.append(text)
        text += f" {ANSWER}\n"
    return out


def make_trace(n_servers: int, router: str, turns: int = 4, n_predict: int = 8) -> dict:
    convs = [conversation_prompts(t, turns) for t in TOPICS[:n_servers + 1]]
    reqs = [{"prompt": convs[c][t], "n_predict": n_predict} for t in range(turns) for c in range(len(convs))]
    return {"flags": list(FLAGS), "fleet": {"servers": n_servers, "router": router}, "requests": reqs}


# ------------------------------------------------------------------------------------------- the router


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class Policy:
    """The router's choice per request, from the prompt's token ids (`toks`) only."""

    def __init__(self, name: str, n: int):
        self.name, self.n, self.k = name, n, 0
        self.index = [OrderedDict() for _ in range(n)]
        self.sent = [0] * n

    def choose(self, toks: np.ndarray) -> tuple[int, dict]:
        k, self.k = self.k, self.k + 1
        if self.name == "round-robin":
            return k % self.n, {"turn": k}
        if self.name == "session":
            key = ("tokens", _digest(toks[:SESSION_TOKENS].astype(np.int32).tobytes()))
            return _digest(repr(key).encode()) % self.n, {"key": repr(key)}
        chain, prev = [], 0
        for j in range(len(toks) // BLOCK_TOKENS):
            prev = _digest(prev.to_bytes(8, "little") + toks[j * BLOCK_TOKENS:(j + 1) * BLOCK_TOKENS]
                           .astype(np.int32).tobytes())
            chain.append(prev)
        m = []
        for ix in self.index:
            c = 0
            while c < len(chain) and chain[c] in ix:
                c += 1
            m.append(c)
        best = max(m)
        if best > 0 and best > CACHE_THRESHOLD * len(chain):
            s = min(range(self.n), key=lambda j: (-m[j], self.sent[j], j))
        else:
            s = min(range(self.n), key=lambda j: (len(self.index[j]), self.sent[j], j))
        ix = self.index[s]
        for key in reversed(chain):
            ix[key] = None
            ix.move_to_end(key)
        while len(ix) > INDEX_BLOCKS:
            ix.popitem(last=False)
        self.sent[s] += 1
        return s, {"matched_blocks": best, "blocks": len(chain)}


class Router:
    """`with Router(servers, policy) as url:` a real HTTP proxy in front of `servers` (LlamaServer):
    POST /completion goes to the server the policy chooses (the body forwarded unchanged), its
    status and body come back, the server's number in the header X-Slotlab-Server."""

    def __init__(self, servers, policy: Policy):
        self.servers, self.policy, self.lines = servers, policy, []
        self.lock = threading.Lock()
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                with router.lock:  # one decision at a time, in arrival order
                    st, tok = router.servers[0].post("/tokenize", {"content": body["prompt"], "add_special": True,
                                                                    "parse_special": True})
                    assert st == 200, tok
                    toks = np.asarray(tok["tokens"], dtype=np.int64)
                    s, seen = router.policy.choose(toks)
                    router.lines.append({"i": len(router.lines), "server": s, "n_tokens": len(toks), **seen})
                st, out = router.servers[s].post(self.path, body)
                data = json.dumps(out).encode()
                self.send_response(st)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Slotlab-Server", str(s))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> str:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _post(url: str, body: dict):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read()), int(r.headers["X-Slotlab-Server"])
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), int(e.headers["X-Slotlab-Server"])


def record(router: str, n_servers: int = 2, name: str | None = None) -> Path:
    from contextlib import ExitStack

    from slotlab.llama.model import default_model_path
    from tests.golden.llama_server import LlamaServer

    name = name or f"docs_chat_{n_servers}_{router.replace('-', '_')}"
    OUT.mkdir(parents=True, exist_ok=True)
    trace = make_trace(n_servers, router)
    model = default_model_path()
    with ExitStack() as st:
        servers = [st.enter_context(LlamaServer(model, [*FLAGS, "-lv", "4"], log=OUT / f"{name}.server{k}.log"))
                   for k in range(n_servers)]
        rt = Router(servers, Policy(router, n_servers))
        url = st.enter_context(rt)
        results = []
        for i, r in enumerate(trace["requests"]):
            body = {"prompt": r["prompt"], "n_predict": r["n_predict"], "temperature": 0.0, "ignore_eos": True,
                    "id_slot": -1}
            status, out, s = _post(url, body)
            results.append({"server": s, **_request_result(status, out)})
            print(f"{name} {i:>2}: server {s} slot {results[-1]['id_slot']} cache_n {results[-1]['cache_n']} "
                  f"prompt_n {results[-1]['prompt_n']}", flush=True)
    (OUT / f"{name}.json").write_text(json.dumps(trace, indent=1) + "\n")
    (OUT / f"{name}.fleet.json").write_text(json.dumps({"flags": FLAGS, "servers": n_servers, "router": router,
                                                        "results": results, "router_log": rt.lines},
                                                       indent=1, ensure_ascii=False) + "\n")
    return OUT / f"{name}.json"


def main(argv: list[str]) -> int:
    import argparse

    from bench.build_llama_server import server_binary

    ap = argparse.ArgumentParser(prog="python -m tests.golden.record_fleet")
    ap.add_argument("routers", nargs="*", help=f"routers to record (default: {' '.join(ROUTERS)})")
    ap.add_argument("--servers", type=int, default=2)
    args = ap.parse_args(argv)
    bad = [r for r in args.routers if r not in ROUTERS]
    if bad:
        ap.error(f"unknown router {bad[0]} (one of: {', '.join(ROUTERS)})")
    if server_binary() is None:
        print("llama-server is not built (make llama-server): nothing recorded; the committed recordings stay")
        return 0
    for r in args.routers or ROUTERS:
        record(r, args.servers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
