"""Run llama.cpp's own HTTP server tests (the pinned copy in `tests/llamacpp/vendor/`, in llama.cpp's
layout) against a server binary, the real `llama-server` or `slotlab serve`, and write each test's
outcome to JSON.

    python -m tests.llamacpp.run_server_tests --server slotlab [--only-required] [-k EXPR] [--out F]
    python -m tests.llamacpp.run_server_tests --server real --record [unit/test_x.py ...]
                                                               -> real_server_outcomes.json

What the runner changes, and why (everything else is the upstream tests as they are):
- the tests run in a scratch copy under build/ with their own requirements.txt installed into a venv
  of their own (build/llamacpp-tests-venv): their pins (openai~=2.14, numpy~=2.2, pytest~=8.3) are not
  slotlab's;
- every model the tests would fetch from the Hugging Face hub (`--hf-repo`, `--hf-file`,
  `--model-url`, on a preset or set by a test) is replaced by slotlab's default model (Gemma 3 270M):
  one model, no network, the same weights for both servers. `download_file` (LoRA adapters, draft
  models) raises instead of downloading, so a test needing such a file errors on both servers alike;
- `ServerPreset.load_all` (it pre-downloads every preset's model by starting it once) does nothing;
- the server binary is a wrapper that adds `--no-repack -t 2` (how this repo runs llama-server
  everywhere) in front of the test's own flags, so a test that sets its own thread count still wins;
- like llama.cpp's tests.sh, tests marked `slow` are deselected and SLOW_TESTS is unset.

Outcomes are per pytest node id: passed, failed, error (setup/teardown failed), skipped, and in a
recording "timeout" (pytest-timeout stopped it: the machine, not the server, decided), with the
first line of the failure and, when the server printed one, its own error line."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENDOR = HERE / "vendor"  # a llama.cpp root: tools/server/tests, models/templates, LICENSE
UPSTREAM = VENDOR / "tools" / "server" / "tests"  # the test suite itself
BUILD = ROOT / "build"
VENV = BUILD / "llamacpp-tests-venv"
REAL_OUTCOMES = HERE / "real_server_outcomes.json"
NOT_MODELLED = HERE / "not_modelled.toml"
# not in upstream's requirements.txt: a hung request must fail its test, not stall CI for an hour
EXTRA_REQUIREMENTS = ["pytest-timeout==2.3.1"]
TEST_TIMEOUT_S = 300

# appended to the scratch copy's utils.py: the tests do `from utils import *` after it ran
UTILS_PATCH = '''

# ---- slotlab runner (tests/llamacpp/run_server_tests.py): no hub, the default model ----
_SLOTLAB_MODEL = os.environ["SLOTLAB_TEST_MODEL"]
_slotlab_original_start = ServerProcess.start


def _slotlab_start(self, *args, **kwargs):
    if self.model_hf_repo or self.model_hf_file or self.model_url:
        self.model_hf_repo = self.model_hf_file = self.model_url = None
        self.model_file = _SLOTLAB_MODEL
    if os.environ.get("SLOTLAB_START_TIMEOUT") and not args and "timeout_seconds" not in kwargs:
        kwargs["timeout_seconds"] = int(os.environ["SLOTLAB_START_TIMEOUT"])  # --start-timeout (a loaded machine)
    return _slotlab_original_start(self, *args, **kwargs)


def download_file(url, output_file_path=None):
    raise RuntimeError(f"slotlab runner: downloads are disabled (the tests run offline): {url}")


ServerProcess.start = _slotlab_start
ServerProcess.model_hf_repo = None
ServerProcess.model_hf_file = None
ServerPreset.load_all = staticmethod(lambda: None)
'''

# loaded with -p: per-node-id outcomes to $SLOTLAB_OUTCOMES; $SLOTLAB_SELECT (a JSON list of node ids)
# deselects every other test and fails the session when one of them no longer exists
PLUGIN = '''
import json, os, re
import pytest

_results = {}


def pytest_collection_modifyitems(session, config, items):
    path = os.environ.get("SLOTLAB_SELECT")
    if not path:
        return
    want = set(json.load(open(path)))
    have = {it.nodeid for it in items}
    files = {n.split("::")[0] for n in have}
    missing = sorted(n for n in want - have if n.split("::")[0] in files)
    if missing:
        raise pytest.UsageError("selected tests not collected (stale list?): " + ", ".join(missing))
    keep = [it for it in items if it.nodeid in want]
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid not in want])
    items[:] = keep


def _message(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:300]
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def _server_said(report):
    # the server's own last error line (its stdout/stderr is the test's captured stdout): slotlab's
    # "slotlab: error: ..." or a llama.cpp log line at level E
    said = [ln for ln in report.capstdout.splitlines()
            if re.search(r"^slotlab[a-z ]*: error|^ERROR:|^[0-9.]+ E |^[A-Za-z.]*Error: ", ln)]
    return said[-1][:300] if said else None


def pytest_runtest_logreport(report):
    r = _results.setdefault(report.nodeid, {"outcome": "passed", "duration_s": 0.0})
    r["duration_s"] = round(r["duration_s"] + report.duration, 2)
    if report.failed and "server_said" not in r and _server_said(report):
        r["server_said"] = _server_said(report)
    if report.when == "call":
        if report.failed:
            r["outcome"], r["message"] = "failed", _message(report)
        elif report.skipped:
            r["outcome"], r["message"] = "skipped", _message(report)
    elif report.failed and r["outcome"] in ("passed", "skipped"):
        r["outcome"], r["message"] = "error", f"{report.when}: " + _message(report)
    elif report.skipped and report.when == "setup":
        r["outcome"], r["message"] = "skipped", _message(report)


def pytest_runtest_logfinish(nodeid, location):
    # one line per finished test, so a long run shows (and keeps) its progress
    with open(os.environ["SLOTLAB_OUTCOMES"] + "l", "a") as f:
        f.write(json.dumps({"nodeid": nodeid, **_results.get(nodeid, {})}) + "\\n")


def pytest_sessionfinish(session):
    with open(os.environ["SLOTLAB_OUTCOMES"], "w") as f:
        json.dump(dict(sorted(_results.items())), f, indent=1)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_venv() -> Path:
    """The tests' own venv, rebuilt when requirements.txt (or the extras) change."""
    reqs = (UPSTREAM / "requirements.txt").read_text()
    stamp_text = hashlib.sha256((reqs + "\n".join(EXTRA_REQUIREMENTS)).encode()).hexdigest()
    stamp = VENV / ".requirements-sha256"
    py = VENV / "bin" / "python"
    if py.exists() and stamp.exists() and stamp.read_text() == stamp_text:
        return py
    if VENV.exists():
        shutil.rmtree(VENV)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "-r", str(UPSTREAM / "requirements.txt"),
                    *EXTRA_REQUIREMENTS], check=True)
    stamp.write_text(stamp_text)
    return py


def work_dir(which: str, tag: str | None = None) -> Path:
    """The scratch copy for one server (one per server, so a recording and a slotlab run can overlap;
    `tag` gives a run its own, so two slotlab runs can too)."""
    return BUILD / (f"llamacpp-server-tests-{which}" + (f"-{tag}" if tag else ""))


def prepare_tree(root: Path, wrapper_cmd: list[str]) -> Path:
    """A fresh scratch copy of the vendored tree (the tests reach `../../../models/templates`) with the
    preset patch, the outcome plugin and the server wrapper in its tools/server/tests."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(VENDOR, root)
    work = root / UPSTREAM.relative_to(VENDOR)
    (work / "tmp").mkdir()
    utils = work / "utils.py"
    utils.write_text(utils.read_text() + UTILS_PATCH)
    (work / "slotlab_outcomes.py").write_text(PLUGIN)
    wrapper = work / "server-wrapper.sh"
    quoted = " ".join(f"'{c}'" for c in wrapper_cmd)
    wrapper.write_text(f"#!/bin/sh\nexec {quoted} --no-repack -t 2 \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def server_command(which: str, binary: str | None) -> list[str]:
    if which == "slotlab":
        return [sys.executable, "-m", "slotlab.cli", "serve"]
    from bench.build_llama_server import server_binary

    path = Path(binary) if binary else server_binary()
    if path is None or not path.exists():
        raise SystemExit("llama-server is not built: run `make llama-server` (or pass --binary)")
    return [str(path.resolve())]


def run(which: str, *, binary: str | None = None, select: list[str] | None = None, k: str | None = None,
        out: Path | None = None, extra: list[str] | None = None, quiet: bool = True,
        paths: list[str] | None = None, workers: int = 1, start_timeout: int | None = None,
        test_timeout: int = TEST_TIMEOUT_S, tag: str | None = None) -> dict:
    """Run the suite; returns {"outcomes": {nodeid: {...}}, "wall_s": ..., "returncode": ...}."""
    from slotlab.llama.model import default_model_path

    py = ensure_venv()
    wrapper = prepare_tree(work_dir(which, tag), server_command(which, binary))
    work = wrapper.parent
    outcomes = work / "outcomes.json"
    # the server flags come from the tests alone: no LLAMA_ARG_* from the caller's environment
    env = {k_: v for k_, v in os.environ.items() if k_ not in ("SLOW_TESTS", "DEBUG", "DEBUG_EXTERNAL", "PORT",
                                                             "PYTEST_ADDOPTS") and not k_.startswith("LLAMA_ARG_")}
    env.update(LLAMA_SERVER_BIN_PATH=str(wrapper), SLOTLAB_TEST_MODEL=str(default_model_path()),
               SLOTLAB_OUTCOMES=str(outcomes), PORT=str(_free_port()), PYTHONPATH=str(work),
               LLAMA_CACHE=str(work / "tmp"))
    # slotlab serve runs in slotlab's venv (the wrapper names its python); keep the tests' venv first
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cmd = [str(py), "-m", "pytest", "-p", "slotlab_outcomes", "-p", "no:cacheprovider", "-m", "not slow",
           f"--timeout={test_timeout}", "-rN" if quiet else "-ra", "-q" if quiet else "-v",
           *(paths or ["unit"])]
    if start_timeout:
        env["SLOTLAB_START_TIMEOUT"] = str(start_timeout)
    if select is not None:
        sel = work / "select.json"
        sel.write_text(json.dumps(sorted(select)))
        env["SLOTLAB_SELECT"] = str(sel)
    if workers > 1:  # pytest-xdist, as llama.cpp's tests.sh runs them (each worker on its own port)
        cmd += ["-n", str(workers), "--dist=worksteal"]
    if k:
        cmd += ["-k", k]
    cmd += extra or []
    t0 = time.time()
    log = work / "pytest.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    if not outcomes.exists():
        raise RuntimeError(f"the test run wrote no outcomes (exit {proc.returncode}):\n{log.read_text()[-4000:]}")
    result = {"outcomes": json.loads(outcomes.read_text()), "wall_s": round(wall, 1),
              "returncode": proc.returncode, "log": str(work / "pytest.log")}
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores"


def _outcome(o: dict) -> str:
    """A test stopped by pytest-timeout, or whose server did not answer /health within the tests' 60 s,
    is a "timeout", not a verdict of the server: on a loaded machine the real server can be that slow.
    Re-record those files on an idle one."""
    msg = o.get("message") or ""
    slow = msg.startswith("Failed: Timeout") or msg.startswith("TimeoutError: Server did not start within")
    return "timeout" if slow else o["outcome"]


def record(binary: str | None, files: list[str] | None = None, workers: int = 1) -> dict:
    """Run the suite (or some of its files) against the real llama-server and write (merge into)
    real_server_outcomes.json. A file's outcomes are always replaced whole."""
    from bench.build_llama_server import PIN
    from slotlab.llama.model import default_model_path

    all_files = sorted(f"unit/{p.name}" for p in (UPSTREAM / "unit").glob("test_*.py"))
    files = files or all_files
    unknown = sorted(set(files) - set(all_files))
    if unknown:
        raise SystemExit(f"not upstream test files: {unknown}")
    doc = json.loads(REAL_OUTCOMES.read_text()) if REAL_OUTCOMES.exists() else {"files": {}, "outcomes": {}}
    res = run("real", binary=binary, paths=files, quiet=False, workers=workers)
    fresh = {n: {"outcome": _outcome(o), **({"message": o["message"]} if o.get("message") else {})}
             for n, o in res["outcomes"].items()}
    outcomes = {n: o for n, o in doc["outcomes"].items() if n.split("::")[0] not in files}
    outcomes.update(fresh)
    today = datetime.date.today().isoformat()
    per_file = dict(doc.get("files", {}))
    for f in files:
        ids = [n for n in fresh if n.split("::")[0] == f]
        per_file[f] = {"recorded": today, "workers": workers, "tests": len(ids),
                       "passed": sum(fresh[n]["outcome"] == "passed" for n in ids),
                       "wall_s": round(sum(res["outcomes"][n]["duration_s"] for n in ids), 1)}
    counts: dict[str, int] = {}
    for o in outcomes.values():
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    doc = {
        "what": "llama.cpp tools/server/tests (tests/llamacpp/vendor) against the real llama-server, "
                "recorded by `python -m tests.llamacpp.run_server_tests --server real --record [FILES]`",
        "llama_cpp_python": PIN,
        "model": default_model_path().name,
        "server": "build/llama-server/cmake/bin/llama-server --no-repack -t 2 (bench/build_llama_server.py)",
        "selection": "-m 'not slow', SLOW_TESTS unset (llama.cpp tests.sh default)",
        "machine": _machine(),
        "counts": dict(sorted(counts.items())),
        "files": dict(sorted(per_file.items())),
        "outcomes": dict(sorted(outcomes.items())),
    }
    REAL_OUTCOMES.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return doc


def retry_timeouts(binary: str | None = None, test_timeout: int = 1200) -> dict:
    """Re-run, against the real server, only the tests a recording marked "timeout", with a longer
    pytest-timeout, and merge their outcomes into real_server_outcomes.json. Some upstream tests
    (several seeds, several slots, each a full generation) take over 5 minutes on 2 cores whenever
    anything else runs; their verdict is the server's, not the clock's, once they are given the time."""
    doc = json.loads(REAL_OUTCOMES.read_text())
    ids = sorted(n for n, o in doc["outcomes"].items() if o["outcome"] == "timeout")
    if not ids:
        return doc
    res = run("real", binary=binary, select=ids, quiet=False, workers=1, test_timeout=test_timeout,
              paths=sorted({n.split("::")[0] for n in ids}))
    for n in ids:
        o = res["outcomes"].get(n)
        if o is not None:
            doc["outcomes"][n] = {"outcome": _outcome(o), **({"message": o["message"]} if o.get("message") else {})}
            f = doc["files"][n.split("::")[0]]
            f["retried_timeouts"] = f.get("retried_timeouts", 0) + 1
    for f, rec in doc["files"].items():
        ids_f = [n for n in doc["outcomes"] if n.split("::")[0] == f]
        rec["passed"] = sum(doc["outcomes"][n]["outcome"] == "passed" for n in ids_f)
    counts: dict[str, int] = {}
    for o in doc["outcomes"].values():
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    doc["counts"] = dict(sorted(counts.items()))
    REAL_OUTCOMES.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return doc


def not_modelled() -> dict[str, str]:
    """node id (or a prefix ending in '::' or '[') -> why slotlab does not model what it tests."""
    import tomllib

    data = tomllib.loads(NOT_MODELLED.read_text())
    return {nid: entry["reason"] for entry in data["test"] for nid in entry["ids"]}


def is_excused(nodeid: str, excused: dict[str, str]) -> str | None:
    for key, reason in excused.items():
        if nodeid == key or (key.endswith(("::", "[")) and nodeid.startswith(key)):
            return reason
    return None


def required_tests() -> list[str]:
    """Tests that passed on the real server and are not excused as not modelled."""
    real = json.loads(REAL_OUTCOMES.read_text())["outcomes"]
    excused = not_modelled()
    return sorted(n for n, o in real.items() if o["outcome"] == "passed" and not is_excused(n, excused))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=["slotlab", "real"], default="slotlab")
    ap.add_argument("--binary", help="llama-server binary (default: the one `make llama-server` built)")
    ap.add_argument("--record", action="store_true", help="write real_server_outcomes.json (needs --server real)")
    ap.add_argument("--retry-timeouts", action="store_true",
                    help="re-run the recording's timed-out tests on the real server (--test-timeout, default 1200 s) and merge")
    ap.add_argument("--only-required", action="store_true",
                    help="only the tests that passed on the real server and are not listed in not_modelled.toml")
    ap.add_argument("--only-real-passed", action="store_true", help="only the tests that passed on the real server")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (llama.cpp's tests.sh uses 4)")
    ap.add_argument("--out", type=Path, help="write outcomes JSON here")
    ap.add_argument("--start-timeout", type=int,
                    help="seconds a server may take to answer /health (upstream: 60); for a loaded machine only: "
                         "the recording and CI keep upstream's")
    ap.add_argument("--test-timeout", type=int, default=TEST_TIMEOUT_S, help="pytest-timeout per test")
    ap.add_argument("--tag", help="run in build/llamacpp-server-tests-SERVER-TAG (parallel runs do not share a tree)")
    ap.add_argument("pytest_args", nargs="*",
                    help="test files (unit/test_x.py) and extra pytest arguments (after --); "
                         "with --record: the test files to (re)record")
    a = ap.parse_args(argv)
    if a.retry_timeouts:
        doc = retry_timeouts(a.binary, a.test_timeout if a.test_timeout != TEST_TIMEOUT_S else 1200)
        print(f"retried; now {doc['counts']} -> {REAL_OUTCOMES}")
        return 0
    if a.record:
        if a.server != "real":
            ap.error("--record records the real server: add --server real")
        doc = record(a.binary, a.pytest_args or None, a.workers)
        print(f"recorded; now {len(doc['outcomes'])} tests: {doc['counts']} -> {REAL_OUTCOMES}")
        return 0
    select = None
    if a.only_required:
        select = required_tests()
    elif a.only_real_passed:
        real = json.loads(REAL_OUTCOMES.read_text())["outcomes"]
        select = sorted(n for n, o in real.items() if o["outcome"] == "passed")
    files = [f for f in a.pytest_args if f.startswith("unit/")]
    if select is not None and files:
        select = [n for n in select if n.split("::")[0] in files]
    res = run(a.server, binary=a.binary, select=select, k=a.k, out=a.out, workers=a.workers, paths=files or None,
              extra=[x for x in a.pytest_args if x not in files], start_timeout=a.start_timeout,
              test_timeout=a.test_timeout, tag=a.tag)
    counts: dict[str, int] = {}
    for o in res["outcomes"].values():
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    print(f"{a.server}: {len(res['outcomes'])} tests in {res['wall_s']} s: {dict(sorted(counts.items()))}; "
          f"log {res['log']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
