"""The engine: llama-server's slot scheduler, RAM prompt cache, checkpoints and slot files as a decision
core over a memory interface (slotlab.memory), a driver, and the typed events every view folds."""
