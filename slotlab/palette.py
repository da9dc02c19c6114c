"""The colours a token's provenance has in every picture: the live panel, its static copy and the
course's figures (one palette, so a RAM-cache hit is the same teal wherever it is drawn)."""

#: colour of each provenance kind (token timelines): kept in the slot, restored from a RAM-cache entry,
#: from a slot file, from a checkpoint, shifted by cache reuse, prefilled, generated
COLORS = {"kept": "#4c78a8", "cache": "#72b7b2", "file": "#b279a2", "checkpoint": "#9d755d", "shifted": "#eeca3b",
          "prefill": "#f58518", "generated": "#54a24b"}
