"""Lines as llama-server prints them (`slot %12.*s: id %2d | task %d | ...`, `srv  %12.*s: ...`, with
common_log's `<min>.<sec>.<ms>.<us> <L> ` prefix), for tests that need lines no golden log has."""

_t = [0]


def _ts() -> str:
    _t[0] += 1
    us = _t[0] * 137
    return f"0.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"


def srv(func: str, msg: str, lvl: str = "I") -> str:
    return f"{_ts()} {lvl} srv  {func[:12]:>12}: {msg}\n"


def slot(func: str, sid: int, task: int, msg: str, lvl: str = "I") -> str:
    return f"{_ts()} {lvl} slot {func[:12]:>12}: id {sid:2d} | task {task} | {msg}\n"


def start(n_slots: int = 2, n_ctx: int = 4096, unified: bool = True, cache: str = "128 MiB") -> list[str]:
    """The start-up lines the reader uses (a -lv 4 log)."""
    out = [f"{_ts()} I llama_context: n_ctx                 = {n_ctx * (1 if unified else n_slots)}\n",
           srv("load_model", f"initializing, n_slots = {n_slots}, n_ctx_slot = {n_ctx}, "
                             f"kv_unified = '{'true' if unified else 'false'}'")]
    out += [slot("load_model", i, -1, f"new slot, n_ctx = {n_ctx}") for i in range(n_slots)]
    out += [srv("load_model", f"prompt cache is enabled, size limit: {cache}"),
            srv("init", "idle slots will be saved to prompt cache and cleared upon starting a new task"),
            srv("llama_server", "model loaded")]
    return out


def request(sid: int, task: int, n_prompt: int, *, n_past: int = 0, n_gen: int = 4, lines=()) -> list[str]:
    """Launch, prompt start (with `lines` in between), timings and release of one completion."""
    return [slot("launch_slot_", sid, task, "processing task, is_child = 0"),
            slot("operator()", sid, task, f"new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = {n_prompt}"),
            *lines,
            slot("operator()", sid, task, f"cached n_tokens = {n_past}, memory_seq_rm [{n_past}, end)"),
            slot("print_timing", sid, task, f"prompt eval time =      10.00 ms / {n_prompt - n_past:5d} tokens "
                                             "(    1.00 ms per token,   100.00 tokens per second)"),
            slot("print_timing", sid, task, f"       eval time =      10.00 ms / {n_gen:5d} tokens "
                                             "(    1.00 ms per token,   100.00 tokens per second)"),
            slot("release", sid, task, f"stop processing: n_tokens = {n_prompt + n_gen - 1}, truncated = 0")]
