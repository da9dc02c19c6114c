"""Record golden traces from the real llama-server (built by `make llama-server`).

    python -m tests.golden.record_traces [NAME ...]     # every trace of traces/ without NAME
    python -m tests.golden.record_traces --tiny         # every trace of traces_tiny/
    python -m tests.golden.record_traces --build b11434 [--tiny] [NAME ...]   (or --build b11549)
        # the same traces on another build's server (`make llama-server-b11434`), into traces_b11434/
    python -m tests.golden.record_traces --server PATH --out DIR [NAME ...]   # any binary, any folder
    python -m tests.golden.record_traces --traces tests/golden/traces_proposals --build proposals [NAME ...]
        # the traces of another folder (here: the proposals' flags, recorded next to them)

For every tests/golden/traces/NAME.json it starts llama-server with the trace's flags plus
`--no-repack -t 2 -lv 4 --slot-save-path DIR`, sends the requests exactly as `slotlab replay` does
(greedy, ignore_eos; `"wait": false` moves on once the request occupies a slot), and writes
NAME.llama-server.json (the `slotlab replay --json` schema) and NAME.llama-server.log (the server's
log, from which tests/golden/test_golden.py reads the RAM-cache decisions). A trace that names its
model with `-m` (the tiny hybrid / recurrent models, traces in traces_tiny/) runs on that model, the
others on the default model; NAME is looked up in traces/ and traces_tiny/ (or only in `--traces DIR`). With `--build` / `--out`
the recordings of another build go to their own folder (the traces themselves stay where they are:
each build answers the same requests), with the same two files per trace."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import shutil

from slotlab.engine.replay import install_files, load_trace, resolve_flags
from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer
from tests.golden.trace_models import split_model

DIR = Path(__file__).with_name("traces")
TINY_DIR = Path(__file__).with_name("traces_tiny")


def build_dir(build: str) -> Path:
    """Where the recordings of another build's server live (tests/golden/traces_<build>/)."""
    return Path(__file__).with_name(f"traces_{build}")


def _error(body) -> dict:
    e = (body or {}).get("error", {}) if isinstance(body, dict) else {}
    return {"code": e.get("code"), "message": e.get("message"), "type": e.get("type")}


def _request_result(status: int, body: dict) -> dict:
    if status != 200:
        return {"status": status, "id_slot": None, "cache_n": None, "prompt_n": None, "tokens_evaluated": None,
                "tokens_cached": None, "content": None, "error": _error(body)}
    return {"status": 200, "id_slot": body["id_slot"], "cache_n": body["timings"]["cache_n"],
            "prompt_n": body["timings"]["prompt_n"], "tokens_evaluated": body["tokens_evaluated"],
            "tokens_cached": body["tokens_cached"], "content": body["content"], "error": None}


def send_trace(srv: LlamaServer, trace) -> tuple[list, list]:
    """Send a trace's requests to a running server exactly as `slotlab replay` orders them; returns
    (results in the golden schema, raw /completion bodies)."""
    results: list = [None] * len(trace.requests)
    raw: list = [None] * len(trace.requests)
    threads = []
    for i, r in enumerate(trace.requests):
        if "action" in r:
            body = {"filename": r["filename"]} if "filename" in r else {}
            st, rep = srv.post(f"/slots/{r['id_slot']}?action={r['action']}", body)
            results[i] = {"action": r["action"], "status": st, "reply": rep if st == 200 else {"error": _error(rep)}}
            continue
        req = {"prompt": r["prompt"], "n_predict": r.get("n_predict", -1), "temperature": r.get("temperature", 0.0),
               "ignore_eos": True, "id_slot": r.get("id_slot", -1)}
        for k in ("cache_prompt", "n_cache_reuse", "seed", "message_delimiters"):
            if k in r:
                req[k] = r[k]

        def run(i=i, req=req):
            st, body = srv.post("/completion", req)
            results[i] = _request_result(st, body)
            raw[i] = body

        if r.get("wait", True):
            run()
            continue
        _, before = srv.get("/slots")
        seen = {s.get("id_task") for s in before if s.get("is_processing")}
        th = threading.Thread(target=run)
        th.start()
        threads.append(th)
        deadline = time.time() + 300
        while th.is_alive() and time.time() < deadline:
            _, cur = srv.get("/slots")
            if any(s.get("is_processing") and s.get("id_task") not in seen for s in cur):
                break
            time.sleep(0.002)
    for th in threads:
        th.join()
    return results, raw


def record(trace_path: Path, out_dir: Path | None = None, server: Path | None = None) -> None:
    trace = load_trace(trace_path)
    name = trace_path.stem
    out_dir = out_dir or trace_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    slots_dir = tempfile.mkdtemp(prefix="golden-slots-")
    log = out_dir / f"{name}.llama-server.log"
    install_files(trace, slots_dir)
    model_path, flags = split_model(trace.flags)
    model_path = model_path or default_model_path()
    flags = resolve_flags(flags, type("M", (), {"path": model_path}))
    with LlamaServer(model_path, [*flags, "-lv", "4", "--slot-save-path", slots_dir + "/"], log=log,
                     command=[str(server)] if server else None) as srv:
        results, _ = send_trace(srv, trace)
    keep = out_dir / f"{name}.files"
    wanted = json.loads(trace_path.read_text()).get("keep_files") or []
    out = {"flags": trace.flags, "results": results}
    if wanted and out_dir == trace_path.parent:  # the server-written slot files a test restores in slotlab
        keep.mkdir(exist_ok=True)
        for name in wanted:
            shutil.copyfile(Path(slots_dir) / name, keep / name)
    elif wanted:  # another build's files are not kept (megabytes each), only their sizes
        out["files_written"] = {n: (Path(slots_dir) / n).stat().st_size for n in wanted}
    (out_dir / f"{trace_path.stem}.llama-server.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{trace_path.stem}: {len(results)} results")


def main(argv: list[str]) -> int:
    import argparse

    from bench.build_llama_server import TREES, server_binary

    ap = argparse.ArgumentParser(prog="python -m tests.golden.record_traces")
    ap.add_argument("names", nargs="*", help="traces to record (default: every trace of traces/)")
    ap.add_argument("--tiny", action="store_true", help="every trace of traces_tiny/")
    ap.add_argument("--build", choices=sorted(set(TREES) - {"pin"}),
                    help="record on that build's server (bench/build_llama_server.py) into traces_<build>/")
    ap.add_argument("--server", type=Path, help="the llama-server binary (default: the pin's, or --build's)")
    ap.add_argument("--out", type=Path, help="folder of the recordings (default: the trace's own, or --build's)")
    ap.add_argument("--traces", type=Path, help="the folder of the traces (default: traces/ and traces_tiny/); "
                    "with it the recordings go next to the traces unless --out says otherwise")
    args = ap.parse_args(argv)
    server, out = args.server, args.out
    if args.build:
        server = server or server_binary(args.build)
        if server is None:
            ap.error(f"llama-server {args.build} is not built: run `make llama-server-{args.build}`")
        out = out or (args.traces if args.traces else build_dir(args.build))
    if server is not None and not server.exists():
        ap.error(f"no such binary: {server}")

    def stems(d: Path) -> list[str]:
        return sorted(p.stem for p in d.glob("*.json") if ".llama-server" not in p.name)

    if args.traces:
        names = args.names or stems(args.traces)
        for n in names:
            record(args.traces / f"{n}.json", out, server)
        return 0
    names = args.names or (stems(TINY_DIR) if args.tiny else stems(DIR))
    for n in names:
        record(DIR / f"{n}.json" if (DIR / f"{n}.json").exists() else TINY_DIR / f"{n}.json", out, server)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
