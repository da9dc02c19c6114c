"""The "why" layer's newer rooms: what a session's client changes cost against a stable client
(`stable`), advice tested over the whole session (`advice`), and both folded for one recording
(`session`: what `slotlab simulate --why` prints). The per-miss mechanism stays in slotlab.explain,
the per-call change in slotlab.conversation, conversations told by content in slotlab.identity."""
