"""`slotlab serve`: a llama-server compatible HTTP front over a live engine."""

from slotlab.serve.app import build_app, serve_in_thread

__all__ = ["build_app", "serve_in_thread"]
