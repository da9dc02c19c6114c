"""The lines `LogReader` maps: one pattern per server message, the level the server logs it at, and
the groups the reader takes from it. The messages are the server's own texts (tools/server/*.cpp at
the pinned llama.cpp); where `slotlab.engine.server_log` already has a pattern for a message, it is
reused. `TABLE` (name -> (pattern, level)) is what README.md's table lists.

One table per family of lines, each read by its own module of `slotlab.watch.logread`:

    STARTUP       start-up and shape lines          logread/startup.py
    SELECTION     get_available_slot (steps A-D)    logread/selection.py
    PROMPT        the prompt's start and progress   logread/prompt.py
    CHECKPOINTS   context checkpoints               logread/checkpoints.py
    PROMPT_CACHE  the RAM prompt cache              logread/prompt_cache.py
    LIFECYCLE     launch, release, clears, errors   logread/lifecycle.py
    LIB           library lines (no `slot` / `srv`)

Each row is (name, source, pattern, level): the source is the line's prefix (`slot` lines carry
`id N | task T`, `srv` lines none, `lib` lines are llama.cpp's own), the level the server's macro
(SLT_TRC / SRV_TRC print with the letter I). A line is matched with `search` on its message (after the
prefix) against its source's rows in table order; the first hit wins. A message whose text changed
across builds gets one row per text, side by side in its family's table."""

from __future__ import annotations

import re

from slotlab.engine.server_log import PATTERNS as _SERVER_LOG_PATTERNS

_SL = {kind: pat for pat, kind in _SERVER_LOG_PATTERNS}  # server_log's patterns, by its names
_NUM = r"(-?(?:nan|inf|[\d.]+))"

STARTUP = [
    ("init", "srv", re.compile(r"^initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'"), "INF"),
    ("cache_enabled", "srv", re.compile(r"^prompt cache is enabled, size limit: (?:(\d+) MiB|no limit)"), "TRC"),
    ("cache_disabled", "srv", re.compile(r"^prompt cache is disabled"), "TRC"),
    ("params", "srv", re.compile(r"^(cache_reuse is not supported by this context, it will be disabled|"
                                 r"--cache-idle-slots requires --cache-ram, disabling)"), "WRN"),
    ("idle_mode", "srv", re.compile(r"^idle slots will be saved to prompt cache( and cleared)? upon starting a new "
                                    r"task"), "TRC"),
    ("ckpt_config", "srv", re.compile(r"^context checkpoints enabled, max = (\d+), min spacing = (\d+)"), "TRC"),
    ("draft", "srv", re.compile(r"^speculative decoding context initialized"), "TRC"),
    ("loaded", "srv", re.compile(r"^(model loaded|listening on )"), "INF"),
    ("all_idle", "srv", re.compile(r"^all slots are idle"), "TRC"),
    ("new_slot", "slot", re.compile(r"^new slot, n_ctx = (\d+)"), "TRC"),
]

SELECTION = [
    ("by_id", "slot", re.compile(r"^selected slot by id \((-?\d+)\)"), "INF"),
    ("skip_busy", "slot", re.compile(r"^ - skipping, is_processing = (\d+)"), "TRC"),
    ("skip_empty", "slot", re.compile(r"^ - skipping, slot is empty"), "TRC"),
    ("sim", "slot", re.compile(rf"^ - checking sim = {_NUM} \((\d+)/(\d+)\) > ([\d.]+)"), "TRC"),
    ("by_lcp", "slot", re.compile(rf"^selected slot by LCP similarity, f_sim_best = {_NUM} \(> ([\d.]+) thold\), "
                                  rf"f_keep = {_NUM}"), "INF"),
    ("by_lru", "slot", re.compile(r"^selected slot by LRU, t_last = (-?\d+)"), "INF"),
    ("update_begin", "srv", re.compile(r"^updating prompt cache\s*$"), "TRC"),
    ("update_end", "srv", re.compile(r"^prompt cache update took ([\d.]+) ms"), "TRC"),
    ("defer", "srv", re.compile(r"^(no slot is available|requested slot is unavailable), defer task, "
                                r"id_task = (-?\d+)"), "DBG"),
]

PROMPT = [
    ("new_prompt", "slot", re.compile(r"^new prompt, n_ctx_slot = (\d+), n_keep = (-?\d+), task\.n_tokens = (\d+)"),
     "TRC"),
    ("empty_prompt", "slot", re.compile(r"^empty prompt - releasing slot"), "WRN"),
    ("reuse_unsupported", "slot", _SL["cache_reuse_unsupported"], "WRN"),
    ("reuse_begin", "slot", re.compile(r"^trying to reuse chunks with size > (\d+), n_past = (\d+)"), "DBG"),
    ("shift", "slot", _SL["shift"], "TRC"),
    ("reuse_end", "slot", re.compile(r"^after context reuse, new n_past = (\d+)"), "DBG"),
    ("full_match", "slot", re.compile(r"^need to evaluate at least 1 token for each active slot \(n_past = (\d+)"),
     "WRN"),
    ("n_past_set", "slot", re.compile(r"^n_past was set to (\d+)"), "WRN"),
    ("seq_rm", "slot", re.compile(r"^cached n_tokens = (\d+), memory_seq_rm \[(-?\d+), end\)"), "TRC"),
    ("init_sampler", "slot", re.compile(r"^init sampler, took [\d.]+ ms, tokens: text = (\d+), total = (\d+)"), "TRC"),
    ("pp_progress", "slot", re.compile(r"^prompt processing, n_tokens =\s*(\d+), progress = ([\d.]+)"), "INF"),
    ("gen_progress", "slot", re.compile(r"^n_gen =\s*(\d+), tg ="), "INF"),
    ("t_prompt", "slot", re.compile(r"^prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens"), "INF"),
    ("t_eval", "slot", re.compile(r"^\s*eval time =\s*[\d.]+ ms /\s*(\d+) tokens"), "INF"),
    ("t_total", "slot", re.compile(r"^\s*total time =\s*[\d.]+ ms /\s*(\d+) tokens"), "INF"),
    ("spec_verify", "slot", re.compile(r"^accepted\s+(\d+)/\s*(\d+) draft tokens"), "INF"),
]

CHECKPOINTS = [
    ("ckpt_check", "slot", re.compile(r"^checking checkpoint with \[(-?\d+), (-?\d+)\] against (-?\d+)"), "TRC"),
    ("ckpt_restored", "slot", re.compile(r"restored context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), "
                                         r"n_tokens = (\d+), n_past = (\d+)(?:, size = ([\d.]+) MiB)?"), "TRC"),
    ("ckpt_none", "slot", _SL["checkpoint_none"], "TRC"),
    ("ckpt_invalidated", "slot", re.compile(r"erased invalidated context checkpoint \(pos_min = (-?\d+), "
                                            r"pos_max = (-?\d+), n_tokens = (\d+)(?:, n_swa = (\d+))?"), "TRC"),
    ("ckpt_created", "slot", re.compile(r"^created context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), "
                                        r"pos_max = (-?\d+), n_tokens = (\d+), size = ([\d.]+) MiB"), "TRC"),
    ("ckpt_fifo", "slot", re.compile(r"^erasing old context checkpoint \(pos_min = (-?\d+), pos_max = (-?\d+), "
                                     r"n_tokens = (\d+)"), "WRN"),
    ("ckpt_too_close", "slot", re.compile(r"^erasing context checkpoint too close to an earlier one \(pos_min = "
                                          r"(-?\d+), pos_max = (-?\d+), n_tokens = (\d+)"), "TRC"),
    ("ckpt_supersede", "slot", _SL["checkpoint_supersede"], "TRC"),
]

PROMPT_CACHE = [
    ("save", "srv", re.compile(r"^ - saving prompt with length (\d+), total state size = ([\d.]+) MiB "
                               r"\(draft: ([\d.]+) MiB\)"), "TRC"),
    ("skip_duplicate", "srv", _SL["skip_duplicate"], "TRC"),
    ("skip_over_limit", "srv", re.compile(r" - prompt state size ([\d.]+) MiB exceeds cache size limit ([\d.]+) MiB"),
     "WRN"),
    # the proposals' servers (patches/proposals): -kvcpc's per-entry limit, --cache-ram-lru's placement
    ("skip_entry_limit", "srv", re.compile(r"^ - prompt with (\d+) tokens exceeds the per-entry token limit (\d+), "
                                           r"skipping"), "WRN"),
    ("lru_placed", "srv", re.compile(r"^ - prompt cache LRU: entry with t_last = (-?\d+) placed at (\d+) of (\d+)"),
     "TRC"),
    ("evict_obsolete", "srv", _SL["evict_obsolete"], "TRC"),
    ("evict_make_room", "srv", _SL["evict_make_room"], "WRN"),
    ("evict_byte_limit", "srv", _SL["evict_byte_limit"], "WRN"),
    ("evict_token_limit", "srv", _SL["evict_token_limit"], "WRN"),
    ("alloc_failed", "srv", re.compile(r"^failed to allocate memory for prompt cache state: (.*)"), "ERR"),
    ("limit_reduced", "srv", re.compile(r"^ - cache size limit reduced to ([\d.]+) MiB"), "WRN"),
    ("load_base", "srv", re.compile(rf"^ - looking for better prompt, base f_keep = {_NUM}, f_sim = {_NUM}"), "TRC"),
    ("load_score", "srv", re.compile(rf"^   - prompt with length\s+(\d+), lcp =\s+(\d+), f_keep = {_NUM}, "
                                     rf"f_sim = {_NUM}"), "TRC"),
    ("load_found", "srv", _SL["load"], "TRC"),
    ("restore_failed", "srv", re.compile(r"^failed to restore state with size (\d+)"), "ERR"),
    ("state", "srv", _SL["state"], "TRC"),
    ("state_entry", "srv", re.compile(r"^   - prompt (\S+):\s+(\d+) tokens, checkpoints:\s+(\d+),\s+([\d.]+) MiB"),
     "TRC"),
    ("load_failed", "slot", _SL["load_failed"], "WRN"),
]

LIFECYCLE = [
    ("launch", "slot", re.compile(r"^processing task, is_child = (\d+)"), "INF"),
    ("idle_save", "slot", re.compile(r"^saving idle slot to prompt cache"), "TRC"),
    ("idle_saved", "slot", re.compile(r"^__TEST_TAG_CACHE_IDLE_SLOT__"), "DBG"),
    ("clear", "slot", re.compile(r"^clearing prompt with (\d+) tokens"), "TRC"),
    ("release", "slot", re.compile(r"^stop processing: n_tokens = (\d+), truncated = (\d+)"), "INF"),
    ("purge", "srv", _SL["purge"], "WRN"),
    ("decode_retry", "srv", re.compile(r"failed to find free space in the KV cache, retrying with smaller batch size, "
                                       r"off = (\d+), n_batch = (\d+)(?:, ret = (-?\d+))?"), "WRN"),
    ("decode_failed", "srv", re.compile(r"^(Context size has been exceeded\.|Invalid input batch\.|Compute error\.) "
                                        r"off = (\d+), n_batch = (\d+), ret = (-?\d+)"), "ERR"),
    ("spec_failed", "srv", re.compile(r"^failed to process speculative batch"), "ERR"),
    ("send_error", "srv", re.compile(r"^task id = (-?\d+), error: (.*)", re.S), "ERR"),
    ("cancel", "srv", re.compile(r"^cancel task, id_task = (-?\d+)"), "WRN"),
]

LIB = [
    ("n_swa", "lib", re.compile(r"^n_swa\s+= (\d+)"), None),
    ("swa_full", "lib", re.compile(r"^using full-size SWA cache"), None),
    ("n_ctx", "lib", re.compile(r"^n_ctx\s+= (\d+)"), None),
    ("state_load_error", "lib", re.compile(r"^error loading sequence state file"), None),
]

#: the families, by the name of the module of `slotlab.watch.logread` that reads them
FAMILIES = {"startup": STARTUP, "selection": SELECTION, "prompt": PROMPT, "checkpoints": CHECKPOINTS,
            "prompt_cache": PROMPT_CACHE, "lifecycle": LIFECYCLE}

_ROWS = [row for table in (*FAMILIES.values(), LIB) for row in table]
_BY_SOURCE = {src: [(name, pat, lvl) for name, s, pat, lvl in _ROWS if s == src] for src in ("srv", "slot", "lib")}

#: every line the reader maps, by name: (pattern, level). README's table is made from this.
TABLE = {name: (pat, lvl) for name, src, pat, lvl in _ROWS if src != "lib"}

# lines that belong to a slot selection (get_available_slot, steps A-D) and to a RAM-cache call
SELECTION_LINES = {"by_id", "skip_busy", "skip_empty", "sim", "by_lcp", "by_lru", "update_begin", "update_end"}
CACHE_LINES = {name for name, _s, _p, _l in PROMPT_CACHE}
ALLOC_CHAIN = {"skip_duplicate", "skip_over_limit", "evict_obsolete", "evict_make_room", "alloc_failed",
               "limit_reduced", "skip_entry_limit", "lru_placed"}
#: lines that do not end a block under way (a selection goes on over them)
NEUTRAL = {"all_idle", "t_total", "gen_progress", "pp_progress", "new_slot", "idle_mode", "ckpt_config", "draft",
           "spec_verify"}


def match(src: str | None, msg: str) -> tuple[str, re.Match, str] | None:
    """(name, match, level) of the first pattern of the table that finds `msg`, or None."""
    rows = _BY_SOURCE["slot"] if src == "slot" else (_BY_SOURCE["srv"] if src in ("srv", "que", "res")
                                                      else _BY_SOURCE["lib"] if src == "lib" else ())
    for name, pat, lvl in rows:
        m = pat.search(msg)
        if m is not None:
            return name, m, lvl
    return None
