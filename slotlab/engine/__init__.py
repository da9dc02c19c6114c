"""The engine: llama-server's slot scheduler, RAM prompt cache and checkpoints, driven over the llama layer."""
