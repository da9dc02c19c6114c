"""The server's decision flow for one request, as a picture: request -> slot choice -> RAM-cache save /
load -> n_past -> shift -> the checkpoint rule -> prefill (and checkpoints) -> release -> the idle-slot
loop, each step with the llama-server function that takes it (tools/server/server-context.cpp at the
pin, b11312).

Why a picture of the flow: every later chapter of the course explains one of these steps; a newcomer
needs the order first (which decision can undo which). `STEPS` is the flow as data, `path(engine, task)`
reads from the engine's events what one request did at each step, and `figure` draws the flow with
that request's outcome beside each box, so the picture states only what the events show."""

from __future__ import annotations

from dataclasses import dataclass

from slotlab.engine import event_types as T
from slotlab.figures import png


@dataclass(frozen=True)
class Step:
    key: str
    title: str
    functions: str  # the server's function names (server-context.cpp) that take this step
    rule: str  # the decision, in one line


#: the flow, in the order the server runs it for one completion request
STEPS = (
    Step("request", "request", "handle_completions_impl -> queue_tasks.post",
         "the prompt is tokenized (chat endpoints also mark the message starts)"),
    Step("slot", "slot choice", "process_single_task -> get_available_slot",
         "id_slot if given; else LCP similarity (f_sim > -sps, default 0.10); else LRU (oldest t_last_used)"),
    Step("cache", "RAM cache save / load", "prompt_save -> prompt_load -> prompt_cache->update",
         "on LRU, or LCP with f_keep < 0.5: save the slot, load the best entry (f_keep >= 0.25, beats both ratios)"),
    Step("n_past", "n_past", "update_slots: prompt.tokens.get_common_prefix",
         "n_past = the common prefix of the new prompt and what the slot holds"),
    Step("shift", "shift (--cache-reuse)", "update_slots: llama_memory_seq_rm / seq_add",
         "chunks of >= n_cache_reuse tokens moved down; only when the memory can shift (default: off)"),
    Step("checkpoint", "the checkpoint rule", "update_slots: pos_min_thold, checkpoints.rbegin()",
         "if pos_min >= max(0, pos_next - n_swa): the newest checkpoint with pos_max <= pos_next, else n_past 0"),
    Step("prefill", "prefill", "update_slots: memory_seq_rm [n_past, end), create_checkpoint, llama_decode",
         "the rest of the prompt in batches; checkpoints near its end and at user-message starts"),
    Step("release", "generate, release", "process_token -> send_final_response -> release",
         "the slot keeps its tokens and becomes idle (t_last_used)"),
    Step("idle", "idle-slot loop", "process_single_task: after launch_slot_with_task",
         "at the NEXT launch, every other idle slot is saved to the RAM cache; on a unified KV (the default) cleared"),
)


def _log(engine) -> list:
    return list(engine.events.log if hasattr(engine, "events") else engine)


def _events(engine, task: int) -> list:
    return [e for e in _log(engine) if e.task == task]


def _after_launch(engine, task: int) -> list:
    """The events between `task`'s launch and the next launch: where the idle-slot loop runs (its events
    name no task, since the idle slots have none)."""
    log, out, on = _log(engine), [], False
    for e in log:
        if e.kind == T.TASK_LAUNCHED:
            if on:
                break
            on = e.task == task
        elif on:
            out.append(e)
    return out


def path(engine, task: int) -> dict[str, str]:
    """What request `task` did at each step, from the engine's events (an Engine, or a list of events):
    step key -> a short outcome ("" where the events show nothing for that step)."""
    ev = _events(engine, task)
    kinds = [e.kind for e in ev]
    first = {}
    for e in ev:
        first.setdefault(e.kind, e)
    out = {s.key: "" for s in STEPS}
    n_prompt = next((e.payload.n_prompt for e in ev if e.kind == T.PROMPT_PLAN), None)
    out["request"] = f"task {task}" + (f": {n_prompt} prompt tokens" if n_prompt is not None else "")
    d = first.get(T.SLOT_DECISION)
    if d is not None:
        how = {"id": "by id_slot", "lcp": "by LCP similarity", "lru": "by LRU"}.get(d.payload.how, str(d.payload.how))
        sim = f", f_sim {d.payload.f_sim:.3f}" if d.payload.how == "lcp" else ""
        out["slot"] = f"slot {d.slot} {how}{sim}"
        if not d.payload.update_cache:
            keep = d.payload.f_keep
            out["cache"] = "skipped: the slot is kept" + (f" (f_keep {keep:.3f} >= 0.5)" if keep is not None else "")
    saved = [e for e in ev if e.kind == T.CACHE_ALLOC and e.payload.id_slot == (d.slot if d else -2)]
    loaded = first.get(T.CACHE_LOADED)
    if d is not None and d.payload.update_cache:
        parts = [f"saved {saved[0].payload.n_tokens} tokens as entry #{saved[0].payload.entry_id}" if saved
                 else "nothing to save"]
        parts.append(f"loaded entry #{loaded.payload.entry_id} ({loaded.payload.n_tokens} tokens)" if loaded
                     else "no entry loaded")
        out["cache"] = "; ".join(parts)
    plan = first.get(T.PROMPT_PLAN)
    if plan is not None:
        out["n_past"] = f"common prefix {plan.payload.lcp}"
    shifts = [e for e in ev if e.kind == T.CACHE_REUSE_SHIFT]
    if shifts:
        out["shift"] = f"{len(shifts)} chunk(s) shifted"
    elif T.CACHE_REUSE_UNSUPPORTED in kinds:
        out["shift"] = "refused: the memory cannot shift"
    else:
        out["shift"] = "none"
    r = first.get(T.CHECKPOINT_RESTORED)
    if r is not None:
        out["checkpoint"] = f"restored [{r.payload.pos_min}, {r.payload.pos_max}]: n_past {r.payload.n_past}"
    elif T.CHECKPOINT_NONE in kinds:
        out["checkpoint"] = "none usable: full re-processing, n_past 0"
    elif plan is not None:
        out["checkpoint"] = "not needed"
    res = getattr(getattr(engine, "tasks", {}).get(task), "result", None) if hasattr(engine, "tasks") else None
    created = [e.payload.n_tokens for e in ev if e.kind == T.CHECKPOINT_CREATED]
    if res is not None:
        t = res["timings"]
        out["n_past"] += f" -> cache_n {t['cache_n']}" if out["n_past"] else ""
        out["prefill"] = f"{t['prompt_n']} tokens prefilled" + (f", checkpoints at {created}" if created else "")
    if T.SLOT_RELEASE in kinds:
        rel = first[T.SLOT_RELEASE]
        out["release"] = f"slot {rel.slot} idle with {rel.payload.n_tokens} tokens"
    after = _after_launch(engine, task)
    idle = [e for e in after if e.kind == T.IDLE_SLOT_SAVED]
    clears = [e for e in after if e.kind == T.SLOT_CLEAR and e.payload.reason == "idle_clear"
              and e.payload.n_tokens > 0]
    if idle or clears:
        out["idle"] = (f"after this launch: {len(idle)} idle slot(s) saved" +
                       (f", {len(clears)} cleared" if clears else ""))
    return out


def figure(engine=None, task: int | None = None, *, title: str | None = None):
    """The flow as boxes top to bottom, the server's functions in each; with `engine` and `task`, that
    request's outcome beside each step (and a grey box where the events show it did nothing)."""
    outcome = path(engine, task) if engine is not None and task is not None else {}
    n = len(STEPS)
    right = 12.4 if outcome else 8.2
    fig, ax = png.new(right + 0.4, 0.6 * n + 0.5)
    ax.set_xlim(-0.7, right)
    ax.set_ylim(n - 0.45, -0.75)
    ax.axis("off")
    box_w = 7.7
    for i, s in enumerate(STEPS):
        took = not outcome or outcome.get(s.key, "") not in ("", "none", "not needed")
        face, edge = ("#e8f0f8", "#4c78a8") if took else ("#f4f4f4", "#bbbbbb")
        ax.add_patch(_box(0, i - 0.37, box_w, 0.74, face, edge))
        ax.text(0.12, i - 0.15, s.title, fontsize=9, fontweight="bold", va="center")
        ax.text(box_w - 0.1, i - 0.15, s.functions, fontsize=7, family="monospace", va="center", ha="right",
                color="#333")
        ax.text(0.12, i + 0.17, s.rule, fontsize=7, va="center", color="#555")
        if i + 1 < n:
            ax.annotate("", (0.5, i + 0.63), (0.5, i + 0.37), arrowprops=dict(arrowstyle="->", color="#666"))
        if outcome.get(s.key):
            ax.text(box_w + 0.2, i, outcome[s.key], fontsize=8, va="center", color="#1f4e79" if took else "#888")
    # the loop: after the idle-slot loop, the next request starts again at the top
    ax.annotate("", (0, 0), (0, n - 1), arrowprops=dict(arrowstyle="->", color="#999", ls="--",
                                                       connectionstyle="bar,fraction=-0.05"))
    ax.text(-0.55, (n - 1) / 2, "next request", rotation=90, fontsize=7, color="#777", ha="center", va="center")
    ax.set_title(title or ("llama-server's decisions for one request" +
                           (f" (task {task}: beside each step, what it did)" if outcome else "")), loc="left")
    return fig


def image(engine=None, task: int | None = None, **kw):
    """`image(eng, task)`: the figure as an IPython Image (PNG), for a notebook."""
    return png.image(figure(engine, task, **kw))


def _box(x, y, w, h, face, edge):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", facecolor=face, edgecolor=edge,
                          linewidth=1.2)
