"""Generate slotlab/engine/arg_table.py: llama-server's whole argument table, read from the pinned
llama.cpp's `common/arg.cpp` (the options `common_params_parser_init` registers for
LLAMA_EXAMPLE_SERVER) and `common/common.h` (the defaults of the fields they set).

    .venv/bin/python tools/gen_arg_table.py            # rewrite slotlab/engine/arg_table.py
    .venv/bin/python tools/gen_arg_table.py --check    # exit 1 if the committed table is stale

Why a generated table: the server accepts ~200 options; copying them by hand drifts the first time
llama.cpp is bumped. CI has no llama.cpp tree, so the table is committed and
tests/engine/test_params_table.py regenerates it when the tree is present and compares.

What is read, per option (`add_opt(common_arg(...).set_...())`):
- names (`args`), negations (`args_neg`), the env variable (`.set_env`), the value hints;
- the handler's kind, from its lambda's parameters: "void" (a switch), "bool" (a switch with a
  negation), "int" (the parser applies std::stoi), "string", "str_str" (two values);
- for string handlers that convert the value, the conversion ("float" = std::stof, "uint" =
  std::stoul, "int" = std::stoi) when every use of the value goes through it;
- the field the handler sets (`params.X = ...`, first one) and that field's default from common.h,
  with the server's per-example overrides (`params.n_parallel = -1` for LLAMA_EXAMPLE_SERVER);
- `.set_sampling()` / `.set_spec()`; an option is the server's when its examples hold
  LLAMA_EXAMPLE_SERVER or LLAMA_EXAMPLE_COMMON and its excludes do not hold LLAMA_EXAMPLE_SERVER.
The one `if (ex == LLAMA_EXAMPLE_SERVER) {...} else {...}` in the parser takes its server branch;
any other statement-level `if` there is an error (the generator would not know which options exist).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP = ROOT / "build/llama-server/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
OUT = ROOT / "slotlab/engine/arg_table.py"
EXAMPLE = "LLAMA_EXAMPLE_SERVER"


# --- C++ scanning ----------------------------------------------------------------------------------

def strip_comments(src: str) -> str:
    """Remove // and /* */ comments, leaving string and char literals (which may hold "//") alone."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c in "\"'":
            j = _skip_literal(src, i)
            out.append(src[i:j])
            i = j
        elif src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _skip_literal(src: str, i: int) -> int:
    q, j = src[i], i + 1
    while src[j] != q:
        j += 2 if src[j] == "\\" else 1
    return j + 1


def match_close(src: str, i: int) -> int:
    """Index just past the bracket closing the one at src[i] (literals skipped)."""
    depth, j = 0, i
    while True:
        c = src[j]
        if c in "\"'":
            j = _skip_literal(src, j)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1


def split_top(src: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets and literals."""
    parts, depth, start, j = [], 0, 0, 0
    while j < len(src):
        c = src[j]
        if c in "\"'":
            j = _skip_literal(src, j)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(src[start:j].strip())
            start = j + 1
        j += 1
    parts.append(src[start:].strip())
    return [p for p in parts if p]


_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def c_string(lit: str) -> str:
    """The value of one or more adjacent C string literals."""
    out = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', lit):
        out.append(re.sub(r"\\(.)", lambda e: _ESC.get(e.group(1), e.group(1)), m.group(1)))
    return "".join(out)


def is_string_literal(expr: str) -> bool:
    return bool(re.fullmatch(r'\s*("(?:[^"\\]|\\.)*"\s*)+', expr))


# --- common.h: struct members and their initializers ------------------------------------------------

def struct_members(header: str) -> dict[str, dict[str, tuple[str, str | None]]]:
    """{struct: {member: (type, initializer or None)}} for the structs of common.h."""
    src = strip_comments(header)
    out: dict[str, dict[str, tuple[str, str | None]]] = {}
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{", src):
        end = match_close(src, m.end() - 1)
        body = src[m.end():end - 1]
        # drop nested function bodies / nested braces that are not initializers of members
        members: dict[str, tuple[str, str | None]] = {}
        for stmt in _statements(body):
            dm = re.fullmatch(r"((?:const\s+)?(?:enum\s+|struct\s+)?[\w:<>, *&]+?)\s*\b(\w+)\s*(?:=\s*(.+)|(\{.*\}))?",
                              stmt, re.S)
            if not dm or "(" in dm.group(1):
                continue
            init = dm.group(3) if dm.group(3) is not None else dm.group(4)
            members[dm.group(2)] = (" ".join(dm.group(1).split()), init.strip() if init else None)
        out[m.group(1)] = members
    return out


def _statements(body: str) -> list[str]:
    """Top-level `;`-terminated statements of a struct body; member functions are skipped."""
    stmts, depth, start, j = [], 0, 0, 0
    while j < len(body):
        c = body[j]
        if c in "\"'":
            j = _skip_literal(body, j)
            continue
        if c in "([{":
            if c == "{" and depth == 0 and re.search(r"\)\s*(const\s*)?$", body[start:j]):
                j = match_close(body, j)  # a member function's body
                start = j
                continue
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ";" and depth == 0:
            stmts.append(body[start:j].strip())
            start = j + 1
        j += 1
    return stmts


def cpp_value(init: str | None, macros: dict[str, str]):
    """A Python value for a simple C++ initializer (number, bool, string, {strings}); None otherwise."""
    if init is None:
        return None
    s = init.strip()
    s = macros.get(s, s)
    if s in ("true", "false"):
        return s == "true"
    if is_string_literal(s):
        return c_string(s)
    m = re.fullmatch(r"([-+]?)(0[xX][0-9a-fA-F]+|\d+)[uUlL]*", s)
    if m:
        return int(m.group(1) + m.group(2), 0)
    m = re.fullmatch(r"([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)[fF]?", s)
    if m:
        return float(m.group(1))
    m = re.fullmatch(r"\{(.*)\}", s, re.S)
    if m:
        items = split_top(m.group(1))
        if all(is_string_literal(x) for x in items):
            return [c_string(x) for x in items]
    return None


def field_default(path: str, structs, overrides: dict[str, str]):
    """(type, raw initializer) of `params.<path>` (e.g. "sampling.temp"), with per-example overrides."""
    if path in overrides:
        typ = _field_type(path, structs)
        return typ, overrides[path]
    struct, parts = "common_params", path.split(".")
    for k, name in enumerate(parts):
        mem = structs.get(struct, {}).get(name)
        if mem is None:
            return None, None
        typ, init = mem
        if k == len(parts) - 1:
            return typ, init
        struct = typ.split()[-1]
    return None, None


def _field_type(path, structs):
    struct = "common_params"
    typ = None
    for name in path.split("."):
        mem = structs.get(struct, {}).get(name)
        if mem is None:
            return None
        typ = mem[0]
        struct = typ.split()[-1]
    return typ


# --- arg.cpp: the parser's options ------------------------------------------------------------------

def parser_body(src: str) -> str:
    m = re.search(r"common_params_context\s+common_params_parser_init\s*\([^)]*\)[^{]*\{", src)
    if not m:
        raise SystemExit("common_params_parser_init not found in arg.cpp")
    end = match_close(src, m.end() - 1)
    return src[m.end():end - 1]


def resolve_branches(body: str, overrides: dict[str, str]) -> str:
    """Replace statement-level `if (ex == X) {A} else if ... else {B}` by the branch LLAMA_EXAMPLE_SERVER
    takes; `params.F = V;` statements of the taken branch are recorded as per-example defaults."""
    out, j = [], 0
    pat = re.compile(r"(?<![\w.])if\s*\(")
    while True:
        m = pat.search(body, j)
        if not m:
            out.append(body[j:])
            return "".join(out)
        # only statement-level ifs: at depth 0 of the body
        if _depth_at(body, m.start()) != 0:
            out.append(body[j:m.end()])
            j = m.end()
            continue
        out.append(body[j:m.start()])
        k, taken = m.start(), None
        while True:
            cm = re.compile(r"if\s*\(").match(body, k)
            cond_open = cm.end() - 1
            cond_close = match_close(body, cond_open)
            cond = body[cond_open + 1:cond_close - 1].strip()
            em = re.fullmatch(r"ex\s*==\s*(LLAMA_EXAMPLE_\w+)", cond)
            bm = re.compile(r"\s*\{").match(body, cond_close)
            if bm:
                blk = bm.end() - 1
                blk_end = match_close(body, blk)
            else:  # a single statement
                blk, blk_end = cond_close - 1, body.index(";", cond_close) + 1
            if not em:
                if "add_opt" in body[cond_close:blk_end]:
                    raise SystemExit(f"arg.cpp: options added under `if ({cond})` in the parser: the generator "
                                     "does not know whether the server has them")
                if taken is None:
                    taken = ""  # not an example switch: no options, no defaults
            elif taken is None and em.group(1) == EXAMPLE:
                taken = body[blk + 1:blk_end - 1]
            k = blk_end
            nxt = re.compile(r"\s*else\s+if\s*\(").match(body, k)
            if nxt:
                k = body.index("if", nxt.start())
                continue
            nxt = re.compile(r"\s*else\s*\{").match(body, k)
            if nxt:
                blk = nxt.end() - 1
                blk_end = match_close(body, blk)
                if taken is None:
                    taken = body[blk + 1:blk_end - 1]
                k = blk_end
            break
        taken = taken or ""
        for am in re.finditer(r"^\s*params\.([\w.]+)\s*=\s*([^;]+);", taken, re.M):
            if _depth_at(taken, am.start()) == 0:  # the branch's own statements, not an option's handler
                overrides[am.group(1)] = am.group(2).strip()
        out.append(taken)
        j = k


def _depth_at(src: str, pos: int) -> int:
    depth, j = 0, 0
    while j < pos:
        c = src[j]
        if c in "\"'":
            j = _skip_literal(src, j)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        j += 1
    return depth


def add_opt_calls(body: str) -> list[str]:
    """The argument text of every depth-0 `add_opt(...)` call."""
    calls, j = [], 0
    while True:
        m = re.compile(r"(?<![\w.])add_opt\s*\(").search(body, j)
        if not m:
            return calls
        end = match_close(body, m.end() - 1)
        if _depth_at(body, m.start()) == 0:
            calls.append(body[m.end():end - 1])
        j = end


def lambda_kind(lam: str) -> tuple[str, str, str]:
    """(kind, value parameter name, body) of a handler lambda."""
    m = re.match(r"\[[^\]]*\]\s*\(", lam)
    close = match_close(lam, m.end() - 1)
    params = split_top(lam[m.end():close - 1])
    body = lam[lam.index("{", close) + 1:lam.rindex("}")]
    types = [re.sub(r"\s+", " ", p) for p in params[1:]]
    names = [p.split()[-1].lstrip("&") if len(p.split()) > 1 and not p.endswith("&") else "" for p in params[1:]]
    if not types:
        return "void", "", body
    if len(types) == 2:
        return "str_str", names[0], body
    t = types[0]
    if re.match(r"int\b", t):
        return "int", names[0], body
    if re.match(r"bool\b", t):
        return "bool", names[0], body
    if "string" in t:
        return "string", names[0], body
    raise SystemExit(f"unknown handler parameter type {t!r}")


def value_conversion(kind: str, var: str, body: str) -> str | None:
    """For a string handler: the numeric conversion the server applies to the value when every use of
    it goes through one std::sto* call (then a bad value is an error of the server's parser)."""
    if kind != "string" or not var:
        return None
    uses = [m.start() for m in re.finditer(rf"(?<![\w.]){re.escape(var)}(?!\w)", body)]
    convs = re.findall(rf"std::(sto[a-z]+)\(\s*{re.escape(var)}\s*\)", body)
    if len(uses) != 1 or len(convs) != 1:
        return None
    return {"stof": "float", "stod": "float", "stoi": "int", "stoul": "uint", "stoull": "uint",
            "stol": "int", "stoll": "int"}.get(convs[0])


_WORDS = {"is_truthy": ["on", "enabled", "true", "1"], "is_falsey": ["off", "disabled", "false", "0"],
          "is_autoy": ["auto", "-1"]}


def value_choices(kind: str, var: str, body: str) -> list[str] | None:
    """For a string handler that only compares its value with fixed words (`value == "row"`,
    `is_truthy(value)`) and throws otherwise: those words, the only values the server accepts."""
    if kind != "string" or not var or "throw" not in body:
        return None
    v = re.escape(var)
    words: list[str] = []
    rest = body
    for m in re.finditer(rf'(?<![\w.]){v}\s*==\s*("(?:[^"\\]|\\.)*")', body):
        words.append(c_string(m.group(1)))
    for m in re.finditer(rf"\b(is_truthy|is_falsey|is_autoy)\(\s*{v}\s*\)", body):
        words += [w for w in _WORDS[m.group(1)] if w not in words]
    rest = re.sub(rf'(?<![\w.]){v}\s*==\s*"(?:[^"\\]|\\.)*"', "", rest)
    rest = re.sub(rf"\b(is_truthy|is_falsey|is_autoy)\(\s*{v}\s*\)", "", rest)
    rest = re.sub(rf"(?<![\w.]){v}\.c_str\(\)", "", rest)  # the error message quoting it
    rest = re.sub(r'"(?:[^"\\]|\\.)*"', '""', rest)  # words inside messages are not uses
    if not words or re.search(rf"(?<![\w.]){v}(?!\w)", rest):
        return None
    return words


def handler_field(body: str) -> str | None:
    m = re.search(r"(?<![\w.])params\.([\w.]+)\s*(?:=(?!=)|\|=|\.push_back|\.emplace_back|\.insert|\[)", body)
    return m.group(1) if m else None


def parse_option(call: str) -> dict | None:
    m = re.match(r"\s*common_arg\s*\(", call)
    if not m:
        raise SystemExit(f"add_opt of something other than common_arg: {call[:80]!r}")
    close = match_close(call, m.end() - 1)
    items = split_top(call[m.end():close - 1])
    chain = call[close:]
    names = [c_string(x) for x in split_top(items[0][1:-1])]
    k = 1
    neg: list[str] = []
    if items[k].startswith("{"):
        neg = [c_string(x) for x in split_top(items[k][1:-1])]
        k += 1
    lam = items[-1]
    middle = items[k:-1]  # [value_hint, [value_hint_2,]] help
    hints = [c_string(x) if is_string_literal(x) else None for x in middle[:-1]]
    kind, var, body = lambda_kind(lam)
    examples = {"LLAMA_EXAMPLE_COMMON"}
    excludes: set[str] = set()
    env = None
    sampling = spec = preset_only = False
    for cm in re.finditer(r"\.(set_\w+)\s*\(", chain):
        arg_close = match_close(chain, cm.end() - 1)
        arg = chain[cm.end():arg_close - 1].strip()
        what = cm.group(1)
        if what == "set_examples":
            examples = _example_set(arg)
        elif what == "set_excludes":
            excludes = _example_set(arg)
        elif what == "set_env":
            env = c_string(arg) if is_string_literal(arg) else arg
        elif what == "set_sampling":
            sampling = True
        elif what == "set_spec":
            spec = True
        elif what == "set_preset_only":
            preset_only = True
        else:
            raise SystemExit(f"unknown chained call .{what}()")
    applies = (EXAMPLE in examples or "LLAMA_EXAMPLE_COMMON" in examples) and EXAMPLE not in excludes
    if not applies or preset_only:
        return None
    return {"names": names, "neg": neg, "env": env, "kind": kind,
            "hint": hints[0] if hints else None, "hint2": hints[1] if len(hints) > 1 else None,
            "conv": value_conversion(kind, var, body), "field": handler_field(body),
            "choices": value_choices(kind, var, body), "removed": _removed(body),
            "sampling": sampling, "spec": spec}


def _removed(body: str) -> str | None:
    """The server's error for an option this llama.cpp removed (its handler calls arg_removed)."""
    m = re.search(r'arg_removed\(\s*("(?:[^"\\]|\\.)*")\s*\)', body)
    return "the argument has been removed. " + c_string(m.group(1)) if m else None


_EXAMPLE_VARS: dict[str, set[str]] = {}


def _example_set(arg: str) -> set[str]:
    if arg.startswith("{"):
        return {x.strip() for x in split_top(arg[1:-1])}
    if arg in _EXAMPLE_VARS:
        return set(_EXAMPLE_VARS[arg])
    raise SystemExit(f"unknown examples set {arg!r}")


def read_macros(llama_cpp: Path) -> dict[str, str]:
    macros = {}
    for h in (llama_cpp / "include/llama.h", llama_cpp / "common/common.h"):
        for m in re.finditer(r"^#define\s+(\w+)\s+(\S+)", h.read_text(), re.M):
            macros[m.group(1)] = m.group(2)
    return macros


def build_table(llama_cpp: Path = LLAMA_CPP) -> list[dict]:
    src = strip_comments((llama_cpp / "common/arg.cpp").read_text())
    _EXAMPLE_VARS.clear()
    for m in re.finditer(r"static\s+std::initializer_list<enum\s+llama_example>\s+(\w+)\s*=\s*\{([^}]*)\}", src):
        _EXAMPLE_VARS[m.group(1)] = {x.strip() for x in split_top(m.group(2))}
    structs = struct_members((llama_cpp / "common/common.h").read_text())
    macros = read_macros(llama_cpp)
    overrides: dict[str, str] = {}
    body = resolve_branches(parser_body(src), overrides)
    table = []
    for call in add_opt_calls(body):
        opt = parse_option(call)
        if opt is None:
            continue
        typ, init = field_default(opt["field"], structs, overrides) if opt["field"] else (None, None)
        opt["default"] = cpp_value(init, macros)
        opt["default_cpp"] = None if init is None else " ".join(init.split())
        opt["type"] = typ
        table.append(opt)
    seen: dict[str, str] = {}
    for opt in table:
        for n in opt["names"] + opt["neg"]:
            if n in seen:
                raise SystemExit(f"{n} is registered twice ({seen[n]} and {opt['names'][-1]})")
            seen[n] = opt["names"][-1]
    return table


KEYS = ("names", "neg", "env", "kind", "hint", "hint2", "conv", "field", "type", "default", "default_cpp",
        "sampling", "spec", "choices", "removed")


def render(table: list[dict]) -> str:
    lines = [
        '"""llama-server\'s argument table: every option the pinned llama.cpp\'s common/arg.cpp registers for',
        "the server (LLAMA_EXAMPLE_SERVER or common to all), in its order.",
        "",
        "GENERATED by tools/gen_arg_table.py from common/arg.cpp and common/common.h; do not edit by hand",
        "(tests/engine/test_params_table.py regenerates it when the llama.cpp tree is present).",
        "",
        "Each row: names (the option's spellings), neg (its negations, for `bool` options), env (LLAMA_ARG_*),",
        'kind ("void" switch, "bool" switch with negation, "int" parsed with std::stoi, "string", "str_str"',
        "two values), hint / hint2 (the value hints of the help), conv (the numeric conversion a string",
        'handler applies to its value: "float" std::stof, "int" std::stoi, "uint" std::stoul), field (the',
        "common_params field the handler sets first), type (its C++ type), default (its default as a Python",
        "value when the initializer is a literal; the server's per-example overrides applied), default_cpp",
        "(the initializer as written), sampling / spec (listed under the help's sampling / speculative",
        "sections), choices (the only values the server's handler accepts, when it compares with fixed",
        "words and throws otherwise), removed (the server's error when this llama.cpp removed the option: it still parses the",
        'name, then refuses it)."""',
        "",
        f"KEYS = {KEYS!r}",
        "",
        "ARGS = [",
    ]
    for opt in table:
        lines.append(f"    {tuple(opt[k] for k in KEYS)!r},")
    lines.append("]")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, default=LLAMA_CPP)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed table differs")
    a = ap.parse_args(argv)
    text = render(build_table(a.llama_cpp))
    if a.check:
        same = OUT.exists() and OUT.read_text() == text
        print("arg_table.py is up to date" if same else "arg_table.py is stale: run tools/gen_arg_table.py")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {text.count(chr(10) + '    ([')} options")
    return 0


if __name__ == "__main__":
    sys.exit(main())
