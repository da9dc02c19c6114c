"""Changes to llama-server that no flag of the pinned build makes, as named variants of its rules.

A user whose traffic misses the cache asks next what a change to llama-server itself would give: an
open pull request, a newer build's rule, an eviction order nobody has proposed upstream yet. Each
`Proposal` names one such change, where it comes from (`origin`: a PR, an issue, a build, slotlab),
what it changes in llama.cpp (`changes`: file and function) and the slotlab flags that turn it on
(`args`: the PR's own flags where it has them, otherwise `--proposal NAME`). The decision core runs
the pinned build's rules everywhere else; a proposal is a `ServerParams` value like any flag, so it
shows in the `init` event's flags, in `slotlab report` and the panel, and in every simulation's
header (`describe`).

`verified` is true only for a proposal whose rules were checked against a llama-server built from a
patch (patches/proposals/, `make llama-server-proposals`) on golden traces recorded from it
(tests/golden/traces_proposals/, replayed exactly on paper and on a real context by
tests/golden/test_proposals_golden.py); every other proposal is shown "unverified": it is slotlab's
reading of the change, not a recorded server's."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Proposal", "PROPOSALS", "FLAGLESS", "get", "active", "describe", "label"]


@dataclass(frozen=True)
class Proposal:
    """One change to llama-server's rules (see the module docstring)."""

    name: str
    title: str
    origin: str  # "PR #28046", "issue #28139 / PR #28992", "b11549", "slotlab"
    url: str | None
    changes: str  # llama.cpp file: function
    args: tuple[str, ...]  # the slotlab flags that turn it on
    summary: str
    verified: bool = False  # a patched llama-server's golden traces are replayed exactly
    modelled: bool = True  # False: slotlab's traffic never reaches the changed path (said, not hidden)

    @property
    def status(self) -> str:
        return "verified" if self.verified else "unverified"

    def label(self) -> str:
        """`name (origin, verified|unverified)`: how a report names it."""
        return f"{self.name} ({self.origin}, {self.status})"

    def as_json(self) -> dict:
        return {"name": self.name, "title": self.title, "origin": self.origin, "url": self.url,
                "changes": self.changes, "args": list(self.args), "summary": self.summary,
                "verified": self.verified, "modelled": self.modelled}


PROPOSALS: dict[str, Proposal] = {p.name: p for p in (
    Proposal(
        "cache-ram-lru", "RAM-cache eviction by last use (cf. PR #23666's second chance)",
        "slotlab", "https://github.com/ggml-org/llama.cpp/pull/23666",
        "tools/server/server-task.cpp: server_prompt_cache::alloc (insertion order), server_slot::prompt_save",
        ("--cache-ram-lru",),
        "entries are ordered by when their prompt was last used (the slot's t_last_used when saved; a save "
        "of a prompt already cached refreshes the entry holding it), so the evictions from the front remove "
        "the least recently used entry, not the first inserted: a slot idle for long no longer outlives "
        "conversations used since",
        verified=True),
    Proposal(
        "kvcpc", "per-entry prompt-cache token limit",
        "PR #28046", "https://github.com/ggml-org/llama.cpp/pull/28046",
        "tools/server/server-task.cpp: server_prompt_cache::alloc, update; server-context.cpp: load_model; "
        "common/arg.cpp: -kvcpc",
        ("-kvcpc", "0"),
        "-kvcpc N (--kv-cache-prompt-context): the token limit applies to each entry (N tokens; 0 = one "
        "slot's context) instead of to the whole cache (n_ctx), so with --cache-ram -1 the cache keeps "
        "every conversation --cache-ram allows; an entry above N tokens is not saved",
        verified=True),
    Proposal(
        "cache-disk", "a disk tier below the RAM cache",
        "PR #28092", "https://github.com/ggml-org/llama.cpp/pull/28092",
        "tools/server/server-task.cpp: server_prompt_cache::update, alloc (evictions), load (look-up)",
        ("--cache-disk", "65536"),
        "--cache-disk MiB: an entry the RAM cache's limits evict is written to a disk tier of that size (its "
        "oldest dropped to make room) and load() looks there after RAM with the same f_keep / f_sim rule; a "
        "read costs its bytes at --cache-disk-bandwidth MB/s (2000 by default), counted against the prefill "
        "it saves (the simulated TTFT does not include it). The PR's own rules are not public here: this is "
        "slotlab's reading of it"),
    Proposal(
        "find-better", "look the RAM cache up when the chosen slot keeps its context (issues #28139, #28276)",
        "PR #28992", "https://github.com/ggml-org/llama.cpp/pull/28992",
        "tools/server/server-context.cpp: get_available_slot (update_cache); server-task.cpp: "
        "server_prompt_cache::find_better",
        ("--proposal", "find-better"),
        "get_available_slot consults the RAM cache also when update_cache stayed false (a slot chosen by "
        "similarity that keeps half its context, a request pinned with id_slot to an empty slot, whose "
        "f_keep is 0/0 = NaN): when an entry would beat the slot by load()'s own rule, the slot is saved "
        "and that entry loaded"),
    Proposal(
        "no-sps-idle", "no similarity selection with --cache-idle-slots or -np 1",
        "PR #22083", "https://github.com/ggml-org/llama.cpp/pull/22083",
        "tools/server/server-context.cpp: load_model (slot_prompt_similarity), get_available_slot",
        ("--proposal", "no-sps-idle"),
        "slot selection by prompt similarity is turned off when idle slots are cached (--cache-idle-slots "
        "in effect) or there is one slot: every request takes the least recently used slot and goes "
        "through the RAM cache (save, then load the best entry)"),
    Proposal(
        "slot-file-checkpoints", "context checkpoints kept in slot files, as b11549 does (proposed as #26004)",
        "b11549", "https://github.com/ggml-org/llama.cpp/pull/26004",
        "tools/server/server-context.cpp: handle_slots_save, handle_slots_restore",
        ("--proposal", "slot-file-checkpoints"),
        "a slot file carries the slot's context checkpoints (b11549's rule, on an older build): a restored "
        "hybrid, recurrent or SWA slot can cut back to a checkpoint instead of re-processing the prompt"),
    Proposal(
        "idle-completion-only", "cache only completion slots when idle",
        "PR #26893", "https://github.com/ggml-org/llama.cpp/pull/26893",
        "tools/server/server-context.cpp: process_single_task (idle-slot caching)",
        ("--proposal", "idle-completion-only"),
        "idle rerank, embedding and infill slots are not saved to the RAM cache (those tasks never load "
        "from it); slotlab runs completion tasks only, so on its traffic this changes nothing",
        modelled=False),
)}

#: the proposals turned on by `--proposal NAME` (the others have flags of their own, as their patch does)
FLAGLESS = tuple(n for n, p in PROPOSALS.items() if p.args[:1] == ("--proposal",))


def get(name: str) -> Proposal:
    try:
        return PROPOSALS[name]
    except KeyError:
        raise KeyError(f"no proposal {name!r}: slotlab knows {', '.join(PROPOSALS)}") from None


def active(params) -> list[Proposal]:
    """The proposals `params` (a ServerParams) turns on, in registry order."""
    on = set(params.proposal_names)
    if getattr(params, "cache_ram_lru", False):
        on.add("cache-ram-lru")
    if getattr(params, "kvcpc", -1) >= 0:
        on.add("kvcpc")
    if getattr(params, "cache_disk", 0) > 0:
        on.add("cache-disk")
    return [p for n, p in PROPOSALS.items() if n in on]


def describe(params) -> list[str]:
    """One line per active proposal, for a report's or a simulation's header."""
    return [f"proposal {p.label()}: {p.title}; changes {p.changes}" for p in active(params)]


def label(params) -> str:
    """`pin rules` or the active proposals' labels, comma-separated."""
    ps = active(params)
    return ", ".join(p.label() for p in ps) if ps else "the build's own rules"
