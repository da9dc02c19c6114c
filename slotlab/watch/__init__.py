"""Watching a real llama-server: its log read as slotlab's typed events (`log_reader.LogReader`), so the
panel, the "why" lines and the replay report work on a real server's run. See README.md here."""

from slotlab.watch.log_reader import LOG, LogReader, read_log, requests_json

__all__ = ["LOG", "LogReader", "read_log", "requests_json"]
