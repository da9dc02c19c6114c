"""What a live watch asks the server itself: `GET /props` (n_ctx per slot, number of slots, model),
`GET /slots` (per slot: processing or idle, task, tokens held, cached and processed prompt tokens,
tokens generated) and `GET /metrics` (the server's counters), every `period` seconds.

The log says what the server decided; these say where it stands now, which the log does not print
(slot token counts while a request runs, n_ctx, states) and which a log read from its middle lacks.
`ServerPoller` keeps the last answers in `view` (a `ServerView`) and reports transitions (up, down,
restarted) to a callback. Every request has a timeout; a poll cycle never takes more than about
3 x `timeout`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from slotlab.errors import SlotlabError

#: /metrics counters that only grow while the server lives: one going down means a new process
MONOTONIC = ("prompt_tokens_total", "tokens_predicted_total", "n_decode_total")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text (`llamacpp:name value` lines) to {name: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        name = parts[0].split("{", 1)[0]
        name = name.split(":", 1)[1] if ":" in name else name
        try:
            out[name] = float(parts[1])
        except ValueError:
            continue
    return out


def auth_headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass
class ServerView:
    """The server as its endpoints last showed it."""

    url: str
    up: bool | None = None  # None: not polled yet
    error: str = ""  # why the last poll failed
    t: float = 0.0  # time.time() of the last successful poll
    props: dict = field(default_factory=dict)
    slots: list = field(default_factory=list)  # /slots as returned (empty when the endpoint is off)
    metrics: dict = field(default_factory=dict)
    n_polls: int = 0
    n_failures: int = 0
    n_restarts: int = 0  # restarts seen through the endpoints (counters going back)
    endpoints_off: set = field(default_factory=set)  # endpoints that answered 501 / 404 (not enabled)

    @property
    def n_ctx_slot(self) -> int | None:
        return (self.props.get("default_generation_settings") or {}).get("n_ctx")

    @property
    def n_slots(self) -> int | None:
        return self.props.get("total_slots")

    def slot_lines(self) -> list[str]:
        """One line per slot: state, task, tokens held / cached / processed, generated."""
        out = []
        for s in self.slots:
            if not isinstance(s, dict):
                continue
            state = "processing" if s.get("is_processing") else "idle"
            nt = (s.get("next_token") or [{}])
            nt = nt[0] if isinstance(nt, list) and nt else (nt if isinstance(nt, dict) else {})
            line = f"slot {s.get('id')}: {state}"
            if "id_task" in s:
                line += (f", task {s['id_task']}: {s.get('n_prompt_tokens', '?')} tokens, "
                         f"{s.get('n_prompt_tokens_cache', '?')} cached + {s.get('n_prompt_tokens_processed', '?')} "
                         f"processed, {nt.get('n_decoded', '?')} generated")
            out.append(line)
        return out


class ServerPoller:
    """Polls `url` every `period` s in a daemon thread; `on_event(level, text)` hears of transitions."""

    def __init__(self, url: str, *, api_key: str | None = None, period: float = 1.0, timeout: float = 2.0,
                 on_event: Callable[[str, str], None] | None = None, on_poll: Callable[[ServerView], None] | None = None):
        self.url = url.rstrip("/")
        self.period = period
        self.timeout = timeout
        self.on_event = on_event or (lambda level, text: None)
        self.on_poll = on_poll or (lambda view: None)
        self.view = ServerView(self.url)
        try:
            import httpx
        except ImportError:  # a dev dependency of slotlab: `pip install httpx` to poll a server
            raise SlotlabError("polling a server (--url) needs httpx: pip install httpx") from None
        self._httpx = httpx
        self._client = httpx.Client(base_url=self.url, headers=auth_headers(api_key), timeout=timeout, trust_env=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="slotlab-watch-poll", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(3 * self.timeout + 1)
        self._client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll_once()
            except Exception as exc:  # never let the poller die silently
                self.on_event("ERR", f"slotlab watch: polling {self.url} failed: {type(exc).__name__}: {exc}")
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t0)))

    def _get(self, path: str):
        if path in self.view.endpoints_off:
            return None
        r = self._client.get(path)
        if r.status_code in (404, 501):
            self.view.endpoints_off.add(path)
            return None
        r.raise_for_status()
        return r

    def poll_once(self) -> ServerView:
        """One round of /props, /slots, /metrics; updates `view` and reports transitions."""
        v = self.view
        with self._lock:
            v.n_polls += 1
            try:
                props = self._get("/props")
                slots = self._get("/slots")
                metrics = self._get("/metrics")
            except (self._httpx.HTTPError, OSError) as exc:
                v.n_failures += 1
                was = v.up
                v.up, v.error = False, f"{type(exc).__name__}: {exc}"
                if was is not False:
                    self.on_event("ERR", f"slotlab watch: the server at {self.url} does not answer ({v.error})")
                self.on_poll(v)
                return v
            was = v.up
            new_props = props.json() if props is not None else {}
            new_slots = slots.json() if slots is not None else []
            new_metrics = parse_metrics(metrics.text) if metrics is not None else {}
            restarted = any(k in v.metrics and k in new_metrics and new_metrics[k] < v.metrics[k] for k in MONOTONIC)
            v.up, v.error, v.t = True, "", time.time()
            v.props, v.slots, v.metrics = new_props, new_slots if isinstance(new_slots, list) else [], new_metrics
            if was is False:
                self.on_event("INF", f"slotlab watch: the server at {self.url} answers again")
            if restarted:
                v.n_restarts += 1
                self.on_event("WRN", f"slotlab watch: the server at {self.url} was restarted (its /metrics counters "
                                     "went back)")
            self.on_poll(v)
            return v
