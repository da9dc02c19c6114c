"""The colours a token's provenance has in every picture: the live panel, its static copy and the
course's figures (one palette, so a RAM-cache hit is the same teal wherever it is drawn)."""

#: colour of each provenance kind (token timelines): kept in the slot, restored from a RAM-cache entry,
#: from a slot file, from a checkpoint, shifted by cache reuse, prefilled, generated
COLORS = {"kept": "#4c78a8", "cache": "#72b7b2", "file": "#b279a2", "checkpoint": "#9d755d", "shifted": "#eeca3b",
          "prefill": "#f58518", "generated": "#54a24b"}

#: what a request's prompt tokens were, in the miss pictures and the conversation timeline: reused from
#: what the server held (its cache_n: the "kept" blue), and processed although nothing held them (new)
REUSED = COLORS["kept"]
NEW = "#f2b27a"  # a lighter "prefill": processed, and nothing held them
#: the server mechanism that lost tokens it held (slotlab.explain.CAUSES): solid fills
MISS_COLORS = {"dropped": "#7f7f7f", "busy": "#bcbd22", "pinned": "#17becf", "threshold": "#e377c2",
               "slot_kept": "#8c564b", "floor": "#9467bd", "two_axis": "#ff7f0e", "restore_failed": "#aec7e8",
               "no_checkpoint": "#d62728", "checkpoint_early": "#ff9896", "cache_prompt_off": "#c7c7c7",
               "other": "#444444"}
#: the client's change that made the server process again what it held (slotlab.conversation.KINDS):
#: drawn hatched, so a client-side loss never reads as a server mechanism of a similar colour
CLIENT_COLORS = {"system_changed": "#a50026", "tools_changed": "#006837", "message_edited": "#66a61e",
                 "message_inserted": "#e6ab02", "compacted": "#542788", "reply_not_echoed": "#1b9e77",
                 "other": "#8e8e8e"}
#: the hatch of client-side parts (matplotlib; plotly's marker pattern "/")
CLIENT_HATCH = "///"
