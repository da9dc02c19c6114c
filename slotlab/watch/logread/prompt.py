"""The prompt's start and progress in a slot (`update_slots`' prompt phase): `new prompt` (its length),
what cut n_past (a full match, cache reuse with its shifts), `cached n_tokens = N, memory_seq_rm` (the
n_past the server kept, from which `prompt_plan` is made), the sampler's start, the progress and
timing lines, the draft verification; context checkpoints are `checkpoints.py`'s."""

from __future__ import annotations

from slotlab.engine import event_types as T
from slotlab.watch.lines import LogLine
from slotlab.watch.logread.state import PromptStart, SlotState, TaskState


class PromptLines:
    """The prompt family (patterns.PROMPT)."""

    def __init__(self, rd):
        self.rd = rd

    def on_new_prompt(self, m, ln, level):
        s = self.rd.slot(ln.slot)
        n = int(m.group(3))
        t = self.rd.task(ln.task, ln.slot) if ln.task >= 0 else None
        if t is not None:
            t.n_tokens = n
            self.rd.lifecycle.launched(t, n)
            if s.task != ln.task:
                s.task = ln.task
        s.state = "processing_prompt"
        s.n_prompt = n
        s.n_past = s.prompt_n = s.n_gen = 0
        s.shifts = []
        s.plan = PromptStart(lcp=s.lcp_hint, checkpoints=[(c[0], c[1], c[2]) for c in s.checkpoints])
        s.lcp_hint = None
        self.rd.spec(T.PROMPT_START, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_empty_prompt(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        s.plan = None
        self.rd.spec(T.PROMPT_EMPTY, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_full_match(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        if s.plan is not None:
            s.plan.full_match = int(m.group(1))
        self.rd.spec(T.PROMPT_FULL_MATCH, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_n_past_set(self, m, ln, level):
        self.rd.lifecycle.slot_task(ln)
        self.rd.spec(T.PROMPT_FULL_MATCH, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_reuse_unsupported(self, m, ln, level):
        self.rd.lifecycle.slot_task(ln)
        self.rd.spec(T.CACHE_REUSE_UNSUPPORTED, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_reuse_begin(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        if s.plan is not None:
            s.plan.reuse_n_past = int(m.group(2))
        self.rd.spec(T.CACHE_REUSE_BEGIN, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_shift(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        a, b, c, d = (int(m.group(i)) for i in range(2, 6))
        s.shifts.append((a, b, c, d))
        self.rd.spec(T.CACHE_REUSE_SHIFT, ln.msg, level=level, slot=ln.slot, task=ln.task, src=[a, b], dst=[c, d])

    def on_reuse_end(self, m, ln, level):
        self.rd.lifecycle.slot_task(ln)
        self.rd.spec(T.CACHE_REUSE_END, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_seq_rm(self, m, ln, level):
        s, t = self.rd.lifecycle.slot_task(ln)
        n = int(m.group(1))
        if s.plan is not None:
            self.plan(s, t, n, ln)
        if s.n_tokens is None or s.state != "idle":
            s.n_tokens = n
        s.prompt_n = max(0, n - s.n_past)
        self.rd.spec(T.PROMPT_SEQ_RM, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def plan(self, s: SlotState, t: TaskState | None, n_past: int, ln: LogLine) -> None:
        """The prompt start's `prompt_plan`: n_past, the common prefix, the checkpoint and reuse decisions."""
        p, s.plan = s.plan, None
        n_prompt = s.n_prompt
        if p.reuse_n_past is not None:
            lcp = p.reuse_n_past
        elif p.lcp is not None:
            lcp = p.lcp
        elif p.full_match is not None:
            lcp = p.full_match
        else:  # no selection line said (-sps 0): n_past is the common prefix unless a rule cut it
            lcp = n_past
        s.n_past = n_past
        if t is not None:
            t.cache_n = n_past
        div = lcp if lcp < n_prompt else -1
        self.rd.spec(T.PROMPT_PLAN, "", slot=s.id, task=ln.task, n_past=n_past, n_prompt=n_prompt, lcp=lcp,
                     ckpt=p.ckpt, origin=s.origin, shifts=[tuple(x) for x in s.shifts], divergence=div,
                     div_text="", checkpoints=p.checkpoints, pos_min_thold=p.pos_min_thold)

    def on_init_sampler(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        if s.plan is not None:  # prompt start without a `cached n_tokens` line
            s.plan = None
        s.state = "generating"
        s.n_tokens = s.n_prompt
        s.prompt_n = max(0, s.n_prompt - s.n_past)
        self.rd.plain(ln)

    def on_pp_progress(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        s.prompt_n = int(m.group(1))
        self.rd.plain(ln)

    def on_gen_progress(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        s.n_gen = int(m.group(1))
        self.rd.plain(ln)

    def on_t_prompt(self, m, ln, level):
        _, t = self.rd.lifecycle.slot_task(ln)
        if t is not None:
            t.prompt_n = int(m.group(1))
        self.rd.plain(ln)

    def on_t_eval(self, m, ln, level):
        s, t = self.rd.lifecycle.slot_task(ln)
        if t is not None:
            t.predicted_n = int(m.group(1))
        s.n_gen = int(m.group(1))
        self.rd.plain(ln)

    def on_t_total(self, m, ln, level):
        self.rd.lifecycle.slot_task(ln)
        self.rd.plain(ln)

    def on_spec_verify(self, m, ln, level):
        self.rd.lifecycle.slot_task(ln)
        self.rd.spec(T.SPEC_VERIFY, ln.msg, level=level, slot=ln.slot, task=ln.task, n_draft=int(m.group(2)),
                   n_accepted=int(m.group(1)))

