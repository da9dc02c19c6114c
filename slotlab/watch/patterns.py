"""The lines `LogReader` maps: one pattern per server message, the level the server logs it at, and
the groups the reader takes from it. The messages are the server's own texts (tools/server/*.cpp at
the pinned llama.cpp); where `slotlab.engine.server_log` already has a pattern for a message, it is
reused. `TABLE` (name -> (pattern, level)) is what README.md's table lists."""

from __future__ import annotations

import re

from slotlab.engine.server_log import PATTERNS as _SERVER_LOG_PATTERNS

_SL = {kind: pat for pat, kind in _SERVER_LOG_PATTERNS}  # server_log's patterns, by its names
_NUM = r"(-?(?:nan|inf|[\d.]+))"

# (name, pattern, level the server logs it at). Matched with `search` on the message (after the prefix),
# in order, first hit wins. Levels are the server's macros (SLT_TRC / SRV_TRC print with the letter I).

SRV = [
    ("save", re.compile(r"^ - saving prompt with length (\d+), total state size = ([\d.]+) MiB "
                        r"\(draft: ([\d.]+) MiB\)"), "TRC"),
    ("skip_duplicate", _SL["skip_duplicate"], "TRC"),
    ("skip_over_limit", re.compile(r" - prompt state size ([\d.]+) MiB exceeds cache size limit ([\d.]+) MiB"), "WRN"),
    ("evict_obsolete", _SL["evict_obsolete"], "TRC"),
    ("evict_make_room", _SL["evict_make_room"], "WRN"),
    ("evict_byte_limit", _SL["evict_byte_limit"], "WRN"),
    ("evict_token_limit", _SL["evict_token_limit"], "WRN"),
    ("alloc_failed", re.compile(r"^failed to allocate memory for prompt cache state: (.*)"), "ERR"),
    ("limit_reduced", re.compile(r"^ - cache size limit reduced to ([\d.]+) MiB"), "WRN"),
    ("load_base", re.compile(rf"^ - looking for better prompt, base f_keep = {_NUM}, f_sim = {_NUM}"), "TRC"),
    ("load_score", re.compile(rf"^   - prompt with length\s+(\d+), lcp =\s+(\d+), f_keep = {_NUM}, "
                              rf"f_sim = {_NUM}"), "TRC"),
    ("load_found", _SL["load"], "TRC"),
    ("restore_failed", re.compile(r"^failed to restore state with size (\d+)"), "ERR"),
    ("state", _SL["state"], "TRC"),
    ("state_entry", re.compile(r"^   - prompt (\S+):\s+(\d+) tokens, checkpoints:\s+(\d+),\s+([\d.]+) MiB"), "TRC"),
    ("update_begin", re.compile(r"^updating prompt cache\s*$"), "TRC"),
    ("update_end", re.compile(r"^prompt cache update took ([\d.]+) ms"), "TRC"),
    ("purge", _SL["purge"], "WRN"),
    ("decode_retry", re.compile(r"failed to find free space in the KV cache, retrying with smaller batch size, "
                                r"off = (\d+), n_batch = (\d+)(?:, ret = (-?\d+))?"), "WRN"),
    ("decode_failed", re.compile(r"^(Context size has been exceeded\.|Invalid input batch\.|Compute error\.) "
                                 r"off = (\d+), n_batch = (\d+), ret = (-?\d+)"), "ERR"),
    ("spec_failed", re.compile(r"^failed to process speculative batch"), "ERR"),
    ("send_error", re.compile(r"^task id = (-?\d+), error: (.*)", re.S), "ERR"),
    ("cancel", re.compile(r"^cancel task, id_task = (-?\d+)"), "WRN"),
    ("defer", re.compile(r"^(no slot is available|requested slot is unavailable), defer task, "
                         r"id_task = (-?\d+)"), "DBG"),
    ("init", re.compile(r"^initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'"), "INF"),
    ("cache_enabled", re.compile(r"^prompt cache is enabled, size limit: (?:(\d+) MiB|no limit)"), "TRC"),
    ("cache_disabled", re.compile(r"^prompt cache is disabled"), "TRC"),
    ("params", re.compile(r"^(cache_reuse is not supported by this context, it will be disabled|"
                          r"--cache-idle-slots requires --cache-ram, disabling)"), "WRN"),
    ("idle_mode", re.compile(r"^idle slots will be saved to prompt cache( and cleared)? upon starting a new task"),
     "TRC"),
    ("ckpt_config", re.compile(r"^context checkpoints enabled, max = (\d+), min spacing = (\d+)"), "TRC"),
    ("draft", re.compile(r"^speculative decoding context initialized"), "TRC"),
    ("loaded", re.compile(r"^(model loaded|listening on )"), "INF"),
    ("all_idle", re.compile(r"^all slots are idle"), "TRC"),
]

SLT = [
    ("new_slot", re.compile(r"^new slot, n_ctx = (\d+)"), "TRC"),
    ("by_id", re.compile(r"^selected slot by id \((-?\d+)\)"), "INF"),
    ("skip_busy", re.compile(r"^ - skipping, is_processing = (\d+)"), "TRC"),
    ("skip_empty", re.compile(r"^ - skipping, slot is empty"), "TRC"),
    ("sim", re.compile(rf"^ - checking sim = {_NUM} \((\d+)/(\d+)\) > ([\d.]+)"), "TRC"),
    ("by_lcp", re.compile(rf"^selected slot by LCP similarity, f_sim_best = {_NUM} \(> ([\d.]+) thold\), "
                          rf"f_keep = {_NUM}"), "INF"),
    ("by_lru", re.compile(r"^selected slot by LRU, t_last = (-?\d+)"), "INF"),
    ("launch", re.compile(r"^processing task, is_child = (\d+)"), "INF"),
    ("idle_save", re.compile(r"^saving idle slot to prompt cache"), "TRC"),
    ("idle_saved", re.compile(r"^__TEST_TAG_CACHE_IDLE_SLOT__"), "DBG"),
    ("clear", re.compile(r"^clearing prompt with (\d+) tokens"), "TRC"),
    ("load_failed", _SL["load_failed"], "WRN"),
    ("new_prompt", re.compile(r"^new prompt, n_ctx_slot = (\d+), n_keep = (-?\d+), task\.n_tokens = (\d+)"), "TRC"),
    ("empty_prompt", re.compile(r"^empty prompt - releasing slot"), "WRN"),
    ("reuse_unsupported", _SL["cache_reuse_unsupported"], "WRN"),
    ("reuse_begin", re.compile(r"^trying to reuse chunks with size > (\d+), n_past = (\d+)"), "DBG"),
    ("shift", _SL["shift"], "TRC"),
    ("reuse_end", re.compile(r"^after context reuse, new n_past = (\d+)"), "DBG"),
    ("ckpt_check", re.compile(r"^checking checkpoint with \[(-?\d+), (-?\d+)\] against (-?\d+)"), "TRC"),
    ("ckpt_restored", re.compile(r"restored context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), "
                                 r"n_tokens = (\d+), n_past = (\d+)(?:, size = ([\d.]+) MiB)?"), "TRC"),
    ("ckpt_none", _SL["checkpoint_none"], "TRC"),
    ("ckpt_invalidated", re.compile(r"erased invalidated context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), "
                                    r"n_tokens = (\d+)(?:, n_swa = (\d+))?"), "TRC"),
    ("full_match", re.compile(r"^need to evaluate at least 1 token for each active slot \(n_past = (\d+)"), "WRN"),
    ("n_past_set", re.compile(r"^n_past was set to (\d+)"), "WRN"),
    ("seq_rm", re.compile(r"^cached n_tokens = (\d+), memory_seq_rm \[(-?\d+), end\)"), "TRC"),
    ("init_sampler", re.compile(r"^init sampler, took [\d.]+ ms, tokens: text = (\d+), total = (\d+)"), "TRC"),
    ("pp_progress", re.compile(r"^prompt processing, n_tokens =\s*(\d+), progress = ([\d.]+)"), "INF"),
    ("gen_progress", re.compile(r"^n_gen =\s*(\d+), tg ="), "INF"),
    ("t_prompt", re.compile(r"^prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens"), "INF"),
    ("t_eval", re.compile(r"^\s*eval time =\s*[\d.]+ ms /\s*(\d+) tokens"), "INF"),
    ("t_total", re.compile(r"^\s*total time =\s*[\d.]+ ms /\s*(\d+) tokens"), "INF"),
    ("release", re.compile(r"^stop processing: n_tokens = (\d+), truncated = (\d+)"), "INF"),
    ("ckpt_created", re.compile(r"^created context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), pos_max = (-?\d+), "
                                r"n_tokens = (\d+), size = ([\d.]+) MiB"), "TRC"),
    ("ckpt_fifo", re.compile(r"^erasing old context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), "
                             r"n_tokens = (\d+)"), "WRN"),
    ("ckpt_too_close", re.compile(r"^erasing context checkpoint too close to an earlier one \(pos_min = (-?\d+), "
                                  r"pos_max = (-?\d+), n_tokens = (\d+)"), "TRC"),
    ("ckpt_supersede", _SL["checkpoint_supersede"], "TRC"),
    ("spec_verify", re.compile(r"^accepted\s+(\d+)/\s*(\d+) draft tokens"), "INF"),
]

LIB = [
    ("n_swa", re.compile(r"^n_swa\s+= (\d+)"), None),
    ("swa_full", re.compile(r"^using full-size SWA cache"), None),
    ("n_ctx", re.compile(r"^n_ctx\s+= (\d+)"), None),
    ("state_load_error", re.compile(r"^error loading sequence state file"), None),
]

#: every line the reader maps, by name: (pattern, level). README's table is made from this.
TABLE = {name: (pat, lvl) for name, pat, lvl in SRV + SLT}

# lines that belong to a slot selection (get_available_slot, steps A-D) and to a RAM-cache call
SELECTION = {"by_id", "skip_busy", "skip_empty", "sim", "by_lcp", "by_lru", "update_begin", "update_end"}
CACHE = {"save", "skip_duplicate", "skip_over_limit", "evict_obsolete", "evict_make_room", "evict_byte_limit",
          "evict_token_limit", "alloc_failed", "limit_reduced", "load_base", "load_score", "load_found",
          "restore_failed", "state", "state_entry", "load_failed"}
ALLOC_CHAIN = {"skip_duplicate", "skip_over_limit", "evict_obsolete", "evict_make_room", "alloc_failed",
               "limit_reduced"}
NEUTRAL = {"all_idle", "t_total", "gen_progress", "pp_progress", "new_slot", "idle_mode", "ckpt_config", "draft",
            "spec_verify"}


def match(src: str | None, msg: str) -> tuple[str, re.Match, str] | None:
    """(name, match, level) of the first pattern of the table that finds `msg`, or None."""
    table = SLT if src == "slot" else SRV if src in ("srv", "que", "res") else LIB if src == "lib" else ()
    for name, pat, lvl in table:
        m = pat.search(msg)
        if m is not None:
            return name, m, lvl
    return None
