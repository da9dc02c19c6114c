"""What a chat template can take, probed the way llama.cpp's `jinja::caps_get` (common/jinja/caps.cpp)
does: render small conversations and watch which inputs the template touches.

The server acts on two of the answers before every render (common/chat.cpp): a template that never
reads a leading system message's content (Gemma 2 raises on it) gets the system text merged into the
first user message; a template that reads content only as typed parts gets string content wrapped as
`[{"type": "text", ...}]` (and the reverse). llama.cpp counts a value as used when the template reads
it (member access, a test, a filter, a loop); here jinja2's `getattr`/`getitem` hooks, the `string`
test, the list filters and iteration record the same events."""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from slotlab.serve.jinja_env import make_environment

MARKER = "STRING_MARKER"


@dataclass
class Caps:
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_system_role: bool = True


class _Probe:
    """Accesses recorded during one render: (id(container), key) pairs and ops on watched values."""

    def __init__(self):
        self.accessed: set[tuple[int, object]] = set()
        self.ops: dict[int, set[str]] = {}

    def op(self, value, name: str) -> None:
        self.ops.setdefault(id(value), set()).add(name)


class _WatchedStr(str):
    """String content whose use as an array (iteration, indexing) is recorded; iterating a string
    is an error in llama.cpp's engine, so it raises here too."""

    probe: _Probe

    def __iter__(self):
        self.probe.op(self, "array_access")
        raise TypeError("Expected iterable or object type in for loop: got String")


class _WatchedList(list):
    probe: _Probe

    def __iter__(self):
        self.probe.op(self, "array_access")
        return super().__iter__()


class _Current:
    """The probe of the render in progress (the template is compiled once for all probes)."""
    probe: _Probe


def _env(cur: _Current) -> jinja2.Environment:
    class Env(jinja2.Environment):
        def getattr(self, obj, attribute):
            cur.probe.accessed.add((id(obj), attribute))
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            cur.probe.accessed.add((id(obj), argument))
            if isinstance(obj, (_WatchedStr, _WatchedList)) and isinstance(argument, (int, bool)):
                cur.probe.op(obj, "array_access")
            return super().getitem(obj, argument)

    env = make_environment(env_class=Env)
    is_string = env.tests["string"]

    def test_string(value):
        cur.probe.op(value, "test_is_string")
        return is_string(value)

    env.tests["string"] = test_string
    for name in ("selectattr", "select", "rejectattr", "reject", "map"):
        base = env.filters[name]

        def watched(*args, __base=base, __name=name, **kw):
            # jinja2 passes the context or environment first for these filters
            for a in args[:2]:
                if isinstance(a, (_WatchedStr, _WatchedList)):
                    cur.probe.op(a, "selectattr" if __name in ("selectattr", "select") else __name)
            return __base(*args, **kw)

        for attr in ("jinja_pass_arg",):
            if hasattr(base, attr):
                setattr(watched, attr, getattr(base, attr))
        env.filters[name] = watched
    return env


def _run(tmpl: jinja2.Template, cur: _Current, messages: list[dict], probe: _Probe) -> tuple[bool, str]:
    cur.probe = probe
    try:
        out = tmpl.render(messages=messages, tools=[], bos_token="", eos_token="", add_generation_prompt=True)
        return True, out
    except Exception:  # a probe that fails is an answer, as in caps_try_execute
        return False, ""


def detect_caps(source: str) -> Caps:
    caps = Caps()
    cur = _Current()
    tmpl = _env(cur).from_string(source)
    # typed content: is `content` tested as a string, used as an array, and does it still render?
    probe = _Probe()
    content = _WatchedStr(MARKER)
    content.probe = probe
    ok, out = _run(tmpl, cur, [{"role": "user", "content": content}], probe)
    ops = probe.ops.get(id(content), set())
    checks_for_string = "test_is_string" in ops
    used_as_array = bool(ops & {"selectattr", "array_access"})
    if used_as_array:
        caps.supports_typed_content = True
    if not ok or (used_as_array and MARKER not in out):
        caps.supports_string_content = False
    if checks_for_string:
        probe = _Probe()
        parts = _WatchedList()
        parts.probe = probe
        ok, _ = _run(tmpl, cur, [{"role": "user", "content": parts}], probe)
        if ok and probe.ops.get(id(parts), set()) & {"selectattr", "array_access"}:
            caps.supports_typed_content = True
    # system role: is the leading system message's content ever read?
    probe = _Probe()
    msgs = [{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}]
    _run(tmpl, cur, msgs, probe)
    if (id(msgs[0]), "content") not in probe.accessed:
        caps.supports_system_role = False
    return caps
