"""Watching a real llama-server: its log read as slotlab's typed events (`log_reader.LogReader`), so the
panel, the "why" lines and the replay report work on a real server's run; `live.Watch` follows a log
file or a child server live and is what `Panel` shows; `twin.Twin` runs slotlab beside it. See README.md."""

from slotlab.watch.live import Watch
from slotlab.watch.log_reader import LOG, LogReader, read_log, requests_json

__all__ = ["LOG", "LogReader", "Watch", "read_log", "requests_json"]
