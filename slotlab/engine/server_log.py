"""Read RAM-cache decisions out of llama-server's log text (or slotlab's event messages, which
carry the same texts), so the two can be compared decision by decision."""

from __future__ import annotations

import re

# (pattern, kind, groups to keep)
PATTERNS = [
    (re.compile(r" - saving prompt with length (\d+), total state size = ([\d.]+) MiB"), "save"),
    (re.compile(r" - prompt is already in the cache, skipping"), "skip_duplicate"),
    (re.compile(r" - prompt state size ([\d.]+) MiB exceeds cache size limit"), "skip_over_limit"),
    (re.compile(r" - removing obsolete cached prompt with length (\d+)"), "evict_obsolete"),
    (re.compile(r" - making room for prompt cache entry, removing oldest entry \(size = ([\d.]+) MiB\)"), "evict_make_room"),
    (re.compile(r" - cache size limit reached, removing oldest entry \(size = ([\d.]+) MiB\)"), "evict_byte_limit"),
    (re.compile(r" - cache token limit \((\d+), est: (\d+)\) reached, removing oldest entry \(size = ([\d.]+) MiB\)"),
     "evict_token_limit"),
    (re.compile(r" - found better prompt with f_keep = ([\d.]+), f_sim = ([\d.]+)"), "load"),
    (re.compile(r"failed to load prompt from cache"), "load_failed"),
    (re.compile(r" - cache state: (\d+) prompts, ([\d.]+) MiB \(limits: ([\d.]+) MiB, (\d+) tokens, (\d+) est\)"), "state"),
    (re.compile(r"purging slot (\d+) with (\d+) tokens"), "purge"),
    (re.compile(r"failed to find free space in the KV cache, retrying with smaller batch size, off = (\d+), n_batch = (\d+)"),
     "decode_retry"),
    (re.compile(r"forcing full prompt re-processing"), "checkpoint_none"),
    (re.compile(r"restored context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), n_tokens = (\d+), n_past = (\d+)"),
     "checkpoint_restored"),
    (re.compile(r"created context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), pos_max = (-?\d+), n_tokens = (\d+)"),
     "checkpoint_created"),
    (re.compile(r"erased invalidated context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), n_tokens = (\d+)"),
     "checkpoint_invalidated"),
    (re.compile(r"erasing old context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), n_tokens = (\d+)"),
     "checkpoint_evict_fifo"),
    (re.compile(r"erasing context checkpoint too close to an earlier one \(pos_min = (-?\d+), pos_max = (-?\d+), "
                r"n_tokens = (\d+)"), "checkpoint_evict_too_close"),
    (re.compile(r"superseding context checkpoint at n_tokens = (\d+)"), "checkpoint_supersede"),
    (re.compile(r"reusing chunk with size (\d+), shifting KV cache \[(\d+), (\d+)\) -> \[(\d+), (\d+)\)"), "shift"),
    (re.compile(r"cache reuse is not supported - ignoring n_cache_reuse = (\d+)"), "cache_reuse_unsupported"),
]


def decisions(lines) -> list[tuple]:
    """[(kind, *numbers as strings)] for every cache / retry / checkpoint decision in `lines`."""
    out = []
    for line in lines:
        for pat, kind in PATTERNS:
            m = pat.search(line)
            if m:
                out.append((kind, *m.groups()))
                break
    return out


def decisions_of_engine(engine) -> list[tuple]:
    return decisions(e.message for e in engine.events.log if e.message)


_PATTERNS = PATTERNS  # old name, kept until every reader uses PATTERNS
