"""A Python `jinja2` environment that renders chat templates the way llama.cpp's own Jinja engine
(`common/jinja/`, used by llama-server) does, so the prompt text — and so its tokens — match.

What differs from stock jinja2, and why (each is llama.cpp's behaviour):
- blocks: `trim_blocks` and `lstrip_blocks` on, one trailing newline of the source dropped
  (`lexer.cpp`: "default config for chat template"); `break`/`continue` (loopcontrols).
- undefined values are lenient: attribute access, filters and tests on them give empty results
  rather than errors (`value_undefined` builtins), so `message.tool_calls|length` works when absent;
  `"text" + undefined` is "text" (`runtime.cpp`: null/undefined concatenate as an empty string).
- `tojson` keeps key order, `ensure_ascii` off, separators `", "`/`": "` (`value.cpp` tojson); the
  `string` filter of a list or dict is JSON too; booleans print `True`/`False`.
- globals: `raise_exception(msg)` fails the render with "Jinja Exception: msg", `strftime_now(fmt)`
  formats the render's clock in local time, `namespace`, `dict`, `range` (jinja2 has the
  `true`/`false`/`none` literals in both spellings already).
"""

from __future__ import annotations

import json
import time

import jinja2
from jinja2.ext import loopcontrols


class TemplateRaised(Exception):
    """`raise_exception(...)` in a template (the server's "Jinja Exception: ...")."""


class Lenient(jinja2.ChainableUndefined):
    """llama.cpp's `value_undefined`: printing gives "", filters/attributes give empty values."""

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    # runtime.cpp binary_expression: `string + undefined` (either side) is the string, the undefined
    # side read as "" ("treating null/undefined as empty string for string concatenation"); any other
    # arithmetic on an undefined value fails the render
    def __add__(self, other):
        if isinstance(other, str):
            return other
        return self._fail_with_undefined_error()

    def __radd__(self, other):
        if isinstance(other, str):
            return other
        return self._fail_with_undefined_error()


def _tojson(value, indent=None, separators=None, ensure_ascii=False, sort_keys=False):
    if sort_keys:
        raise jinja2.TemplateRuntimeError("tojson sort_keys=true not implemented")
    if isinstance(value, jinja2.Undefined):
        value = None
    item_sep = separators[0] if separators else (", " if indent is None else ",")
    key_sep = separators[1] if separators and len(separators) > 1 else ": "
    return json.dumps(value, indent=indent, separators=(item_sep, key_sep), ensure_ascii=bool(ensure_ascii))


def _string(value):
    if isinstance(value, (list, dict)):
        return _tojson(value)
    if isinstance(value, jinja2.Undefined):
        return ""
    return str(value)


def _raise(msg):
    raise TemplateRaised(f"Jinja Exception: {msg}")


def _finalize(value):
    if isinstance(value, (list, dict)):
        return _string(value)
    return value


NOW = "__slotlab_now__"  # render variable: the clock `strftime_now` reads (epoch seconds)


@jinja2.pass_context
def _strftime_now(ctx, fmt):
    """llama.cpp formats its context's creation time (`time(nullptr)`) in local time; a render may
    fix that clock with the `NOW` variable (recorded comparisons do)."""
    now = ctx.get(NOW)
    return time.strftime(fmt, time.localtime(time.time() if now is None else now))


def make_environment(env_class=jinja2.Environment) -> jinja2.Environment:
    env = env_class(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                    extensions=[loopcontrols], undefined=Lenient, finalize=_finalize, autoescape=False)
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now, dict=dict)
    env.filters["tojson"] = _tojson
    env.filters["string"] = _string
    return env
