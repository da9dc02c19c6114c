"""Trace replay: the same requests, in the same order, as the golden-trace recorder sends them to
the real llama-server, and the same JSON answer (`slotlab replay TRACE --json`).

A trace is `{"flags": [...llama-server flags], "requests": [...]}`. A request is
`{"prompt": str, "n_predict": int, "id_slot": int, "cache_prompt": bool, "n_cache_reuse": int,
"wait": bool}` or a slot action `{"action": "save"|"restore"|"erase", "id_slot": int, "filename": str}`.
Requests run greedy with `ignore_eos`. `{model}` in the flags stands for the model being run. `"wait": false` moves on as soon as the request occupies a
slot (or has finished); everything else waits for the answer."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from slotlab.errors import TraceError

_REQ_FIELDS = {"prompt": str, "n_predict": int, "id_slot": int, "cache_prompt": bool, "n_cache_reuse": int,
               "wait": bool, "temperature": (int, float), "seed": int, "message_delimiters": list,
               # what `slotlab simulate` reads and a recording proxy writes; replay runs in order and ignores them
               "arrival": (int, float), "output": list,
               # a chat call as the client sent it (slotlab proxy --record): slotlab.conversation compares
               # each with its conversation's previous one; replay runs the rendered `prompt`
               "messages": list, "tools": list, "reply": (dict, str), "session_id": (str, int), "endpoint": str}
_ACT_FIELDS = {"action": str, "id_slot": int, "filename": str, "wait": bool}
#: the endpoints whose message delimiters come from the chat template (every build reads them)
CHAT_ENDPOINTS = ("/chat/completions", "/v1/messages", "/responses")


def is_chat(r: dict) -> bool:
    """A trace request recorded from a chat endpoint (its `message_delimiters` are the template's)."""
    return str(r.get("endpoint") or "").endswith(CHAT_ENDPOINTS)




@dataclass
class Trace:
    flags: list[str]
    requests: list[dict]
    path: str | None = None
    files: dict | None = None  # {"name in the slot dir": "path relative to the trace file"}


def parse_trace(data: Any, path: str | None = None) -> Trace:
    where = path or "trace"
    if not isinstance(data, dict):  # noqa: SIM102
        raise TraceError(f"{where}: a trace is a JSON object with \"flags\" and \"requests\"")
    flags = data.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise TraceError(f"{where}: \"flags\" must be a list of strings (llama-server flags)")
    reqs = data.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise TraceError(f"{where}: \"requests\" must be a non-empty list")
    for i, r in enumerate(reqs):
        if not isinstance(r, dict):
            raise TraceError(f"{where}: requests[{i}] must be an object")
        fields = _ACT_FIELDS if "action" in r else _REQ_FIELDS
        for k, v in r.items():
            if k not in fields:
                raise TraceError(f"{where}: requests[{i}]: unknown field \"{k}\"")
            t = fields[k]
            if isinstance(v, bool) and t is int or not isinstance(v, t):
                raise TraceError(f"{where}: requests[{i}].{k}: expected {getattr(t, '__name__', 'number')}, got {v!r}")
        if "action" in r:
            if r["action"] not in ("save", "restore", "erase"):
                raise TraceError(f"{where}: requests[{i}].action must be save, restore or erase")
            if "id_slot" not in r:
                raise TraceError(f"{where}: requests[{i}]: a slot action needs \"id_slot\"")
        elif "prompt" not in r:
            raise TraceError(f"{where}: requests[{i}]: a request needs \"prompt\" (or \"action\")")
        elif r.get("n_predict", -1) < -1:
            raise TraceError(f"{where}: requests[{i}].n_predict must be >= -1")
    files = data.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise TraceError(f"{where}: \"files\" must map slot-file names to paths")
    return Trace(list(flags), list(reqs), path, files)


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: line {e.lineno}, column {e.colno}: {e.msg}") from None
    return parse_trace(data, str(path))


def resolve_flags(flags: list[str], model=None) -> list[str]:
    """`{model}` in a trace's flags (e.g. `-md {model}`) stands for the model being run."""
    if not any("{model}" in f for f in flags):
        return list(flags)
    if model is not None:
        path = str(model.path)
    elif "-m" in flags or "--model" in flags:
        i = flags.index("-m") if "-m" in flags else flags.index("--model")
        path = flags[i + 1]
    else:
        from slotlab.llama.model import default_model_path

        path = str(default_model_path())
    return [f.replace("{model}", path) for f in flags]


def install_files(trace: Trace, slot_dir: str) -> None:
    """Copy the trace's input slot files into the slot directory."""
    import shutil

    base = Path(trace.path).parent if trace.path else Path.cwd()
    for name, rel in (trace.files or {}).items():
        shutil.copyfile(base / rel, Path(slot_dir) / name)


def request_result(task) -> dict:
    """One request's answer in the golden JSON schema."""
    if task.error is not None:
        # the server's error body names no slot: id_slot is null, as the recorder reads it
        return {"status": task.error.code, "id_slot": None, "cache_n": None, "prompt_n": None,
                "tokens_evaluated": None, "tokens_cached": None, "content": None, "error": task.error.to_json()}
    r = task.result
    return {"status": 200, "id_slot": r["id_slot"], "cache_n": r["timings"]["cache_n"],
            "prompt_n": r["timings"]["prompt_n"], "tokens_evaluated": r["tokens_evaluated"],
            "tokens_cached": r["tokens_cached"], "content": r["content"], "error": None}


def action_result(action: str, task) -> dict:
    if task.error is not None:
        return {"action": action, "status": task.error.code, "reply": {"error": task.error.to_json()}}
    return {"action": action, "status": 200, "reply": task.result}


def replay(trace: Trace, *, model=None, engine=None, progress: Callable[[int, int], None] | None = None,
           slot_save_path: str | None = None, memory_factory: Callable | None = None,
           on_submit: Callable[[int, Any], None] | None = None, observers: Sequence[Callable] = ()) -> dict:
    """Replay `trace` on a new engine (or `engine`) in step mode; returns {"flags", "results", "engine",
    "tasks"} (`tasks`: each request's Task, None for slot actions). `memory_factory(params)` gives the
    memory to run on (default: the real model's context). `on_submit(i, task)` hears of request `i`'s
    completion task as it is queued, before the engine steps (None for a slot action). `observers`:
    `Engine`'s (views subscribed before the first event, e.g. `slotlab.explain.attach`)."""
    from slotlab.engine.scheduler import Engine

    flags = resolve_flags(trace.flags, model)
    tmp = None
    if engine is None:
        if "--slot-save-path" not in flags:
            tmp = tempfile.TemporaryDirectory(prefix="slotlab-slots-")
            flags += ["--slot-save-path", slot_save_path or tmp.name]
        install_files(trace, flags[flags.index("--slot-save-path") + 1])
        if memory_factory is not None:
            from slotlab.engine.params import ServerParams

            params = ServerParams.from_args(flags)
            engine = Engine(params, memory=memory_factory(params), observers=observers)
        else:
            engine = Engine(flags, model=model, observers=observers)
    tasks: list[tuple[dict, Any]] = []
    n = len(trace.requests)
    for i, r in enumerate(trace.requests):
        if "action" in r:
            t = engine.slot_action(r["action"], r["id_slot"], r.get("filename"))
        else:
            t = engine.submit(r["prompt"], n_predict=r.get("n_predict", -1), id_slot=r.get("id_slot", -1),
                              cache_prompt=r.get("cache_prompt"), n_cache_reuse=r.get("n_cache_reuse"),
                              temperature=r.get("temperature", 0.0), seed=r.get("seed", 0xFFFFFFFF), ignore_eos=True,
                              message_delimiters=r.get("message_delimiters"), chat=is_chat(r))
        if on_submit is not None:
            on_submit(i, None if "action" in r else t)
        tasks.append((r, t))
        if r.get("wait", True):
            engine.run_until(lambda: t.done)
        else:
            from slotlab.engine.task import TaskState

            engine.run_until(lambda: t.done or t.state is TaskState.RUNNING)
        if progress:
            progress(i + 1, n)
    engine.run_until_idle()
    results = [action_result(r["action"], t) if "action" in r else request_result(t) for r, t in tasks]
    if tmp is not None:
        tmp.cleanup()
    return {"flags": trace.flags, "results": results, "engine": engine,
            "tasks": [None if "action" in r else t for r, t in tasks]}
