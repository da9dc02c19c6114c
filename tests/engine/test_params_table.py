"""Every llama-server flag parses: the argument table generated from the pinned llama.cpp's
common/arg.cpp, each option in exactly one class, both name forms and the env variables, the server's
value conversions and errors, the request defaults against what the real server reported
(tests/engine/data/params_props.json, recorded by tests/engine/record_params_props.py), and one
production command line starting `slotlab serve`."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from slotlab.engine import arg_values as V
from slotlab.engine.flag_classes import MODEL_SOURCE, SPEED, UNMODELLED
from slotlab.engine.flags import FLAGS, OPTIONS, TABLE
from slotlab.engine.params import ServerParams
from slotlab.serve.defaults import REQUEST_FIELDS, SAMPLING_REQUEST_KEYS, sampling_defaults
from slotlab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "tools" / "gen_arg_table.py"
PROPS = Path(__file__).with_name("data") / "params_props.json"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_arg_table", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- the table --------------------------------------------------------------------------------------

def test_table_regenerates_from_the_vendored_llama_cpp():
    gen = _generator()
    if not (gen.LLAMA_CPP / "common" / "arg.cpp").exists():
        pytest.skip("no llama.cpp tree (build/llama-server): the committed table is what CI has")
    assert gen.render(gen.build_table()) == gen.OUT.read_text(), "run tools/gen_arg_table.py"


def test_table_counts():
    """255 options with 412 spellings and 148 env variables in this llama.cpp; a bump changes these
    numbers on purpose (and the class test below then names what is new)."""
    assert len(TABLE) == 255
    assert sum(len(o.names) + len(o.neg) for o in TABLE) == len(OPTIONS) == 412
    assert sum(1 for o in TABLE if o.env) == 148
    assert Counter(o.kind for o in TABLE) == {"string": 124, "int": 68, "void": 35, "bool": 27, "str_str": 1}
    assert sum(1 for o in TABLE if o.sampling) == 34 and sum(1 for o in TABLE if o.removed) == 5
    row = OPTIONS["--temp"][0]
    assert (row.names, row.env, row.conv, row.field, row.default) == (
        ("--temp", "--temperature"), "LLAMA_ARG_TEMPERATURE", "float", "sampling.temp", 0.8)
    assert OPTIONS["-np"][0].default == -1  # the server's per-example override (auto slots)
    assert OPTIONS["--no-ui"] == (OPTIONS["--ui"][0], False)


def test_table_matches_the_real_servers_help():
    """Live check where the binary is built: the names and env variables `llama-server --help` lists."""
    binary = ROOT / "build/llama-server/cmake/bin/llama-server"
    if not binary.exists():
        pytest.skip("llama-server is not built")
    text = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60).stdout
    names = set()
    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("-----"):
            names.update(re.findall(r"(?:^|,\s+)(-{1,2}[A-Za-z][\w.-]*)", line))
    assert names == set(OPTIONS)
    assert set(re.findall(r"\(env: (\w+)\)", text)) == {o.env for o in TABLE if o.env}


def test_every_option_has_exactly_one_class():
    for o in TABLE:
        modelled = any(n in FLAGS for n in o.names + o.neg)
        classes = [modelled, o.canonical in SPEED, o.canonical in UNMODELLED, o.canonical in MODEL_SOURCE,
                   bool(o.removed) and not modelled]
        assert sum(classes) == 1, (o.canonical, classes)
    every = {o.canonical for o in TABLE}
    assert set(SPEED) <= every and set(UNMODELLED) <= every and set(MODEL_SOURCE) <= every


# --- every flag parses ---------------------------------------------------------------------------------

def _value(opt, tmp: Path) -> list[str]:
    """A value the server accepts for `opt`."""
    c = opt.canonical
    files = {"--chat-template-file": "{{ messages }}", "--api-key-file": "# keys\nk1\nk2\n",
             "--grammar-file": 'root ::= "a"', "--json-schema-file": '{"type": "object"}'}
    if c in files:
        f = tmp / (c.strip("-") + ".txt")
        f.write_text(files[c])
        return [str(f)]
    special = {"--slot-save-path": str(tmp), "--json-schema": '{"type": "string"}', "--chat-template-kwargs": '{"a": 1}',
               "--samplers": "top_k;temperature", "--sampler-seq": "kt", "--reasoning-format": "none",
               "--gpu-layers": "0", "--spec-type": "none", "--logit-bias": "15043+1", "--parallel": "2",
               "--host": "127.0.0.1", "--control-vector-layer-range": ["1", "2"], "--spec-draft-ngl": "auto",
               "--cpu-strict": "1", "--poll": "50", "--dry-base": "2", "--tensor-split": "1,1", "--override-kv": "a=int:1"}
    if c in special:
        v = special[c]
        return v if isinstance(v, list) else [v]
    if opt.choices:
        return [opt.choices[0]]
    if any(n.startswith(("--cache-type-", "--spec-draft-type-")) for n in opt.names):
        return ["q8_0"]
    if opt.kind == "int" or opt.conv in ("int", "uint"):
        return [str(opt.default)] if isinstance(opt.default, int) and not isinstance(opt.default, bool) \
            and opt.default >= 0 else ["1"]
    if opt.conv == "float":
        return ["0.5"]
    return ["x"]


def _cases():
    for o in TABLE:
        for n in o.names:
            yield pytest.param(o, n, True, id=n)
        for n in o.neg:
            yield pytest.param(o, n, False, id=n)


@pytest.mark.parametrize("opt,name,positive", list(_cases()))
def test_every_flag_parses(opt, name, positive, tmp_path):
    args = [name] + (_value(opt, tmp_path) if opt.n_values else [])
    if opt.canonical in MODEL_SOURCE:
        args = ["-m", "local.gguf", *args]
    entry = FLAGS.get(name)
    if opt.removed and entry is None:
        with pytest.raises(ConfigError, match=re.escape(f'"{name}": {opt.removed}')):
            ServerParams.from_args(args)
        return
    p = ServerParams.from_args(args)
    if entry is not None:
        assert entry[0] in p.explicit, (name, entry[0])
    elif opt.canonical in SPEED:
        assert any(line.startswith(f"{name}: ") for line in p.notes), p.notes
    elif opt.canonical in UNMODELLED:
        said = [line for line in p.unsupported_notes() if line.startswith(f"{name}: ")]
        assert said if positive else not said, p.unsupported_notes()
    else:
        assert any(line.startswith(f"{name}: ") for line in p.unsupported_notes())
    # the long spelling with underscores is the same flag (arg.cpp replaces '_' by '-' after "--")
    if name.startswith("--") and "-" in name[2:] and opt.canonical not in MODEL_SOURCE:
        q = ServerParams.from_args([name[:2] + name[2:].replace("-", "_"), *args[1:]])
        assert q == p


def _env_cases():
    for o in TABLE:
        if o.env and not o.removed and o.kind != "str_str":
            yield pytest.param(o, id=o.env)


@pytest.mark.parametrize("opt", list(_env_cases()))
def test_every_env_variable_is_read_like_its_flag(opt, tmp_path):
    pre = ["-m", "local.gguf"] if opt.canonical in MODEL_SOURCE else []
    if opt.kind in ("void", "bool"):
        env, args = {opt.env: "1"}, [opt.names[-1]]
    else:
        value = _value(opt, tmp_path)[0]
        env, args = {opt.env: value}, [opt.names[-1], value]
    from_env = ServerParams.from_args(pre, env=env)
    from_cli = ServerParams.from_args(pre + args)
    assert (from_env, from_env.unsupported) == (from_cli, from_cli.unsupported)


def test_env_switches_and_precedence():
    on = ServerParams.from_args([], env={"LLAMA_ARG_CONT_BATCHING": "off", "LLAMA_ARG_ENDPOINT_METRICS": "true",
                                         "LLAMA_ARG_NO_CACHE_IDLE_SLOTS": "", "LLAMA_ARG_CTX_SIZE": "2048"})
    assert (on.cont_batching, on.metrics, on.cache_idle_slots, on.n_ctx) == (False, True, False, 2048)
    # a value-less flag's variable counts only when truthy
    assert ServerParams.from_args([], env={"LLAMA_ARG_ENDPOINT_METRICS": "no"}).metrics is False
    with pytest.raises(ConfigError, match='environment variable "LLAMA_ARG_CONT_BATCHING": invalid boolean value'):
        ServerParams.from_args([], env={"LLAMA_ARG_CONT_BATCHING": "maybe"})
    with pytest.raises(ConfigError, match='environment variable "LLAMA_ARG_CTX_SIZE".*-c'):
        ServerParams.from_args([], env={"LLAMA_ARG_CTX_SIZE": "lots"})
    # the command line wins, and the server's warning says so
    p = ServerParams.from_args(["-c", "4096", "--temp", "0.5"], env={"LLAMA_ARG_CTX_SIZE": "2048",
                                                                    "LLAMA_ARG_TEMPERATURE": "0.1"})
    assert (p.n_ctx, p.temp) == (4096, V.f32(0.5))
    assert ("warn: LLAMA_ARG_CTX_SIZE environment variable is set, but will be overwritten by command line "
            "argument -c") in p.notes
    # accumulating options collect env and command line, as the server's handlers do
    k = ServerParams.from_args(["--api-key", "b,c"], env={"LLAMA_API_KEY": "a"})
    assert (k.api_keys, k.api_key) == (("a", "b", "c"), "b,c")
    assert ServerParams.from_args([]).n_ctx == 0  # no env unless asked for


# --- values as the server converts them, and its errors ---------------------------------------------

def test_values_are_converted_as_the_server_converts_them(tmp_path):
    p = ServerParams.from_args(["-c", " 4096tokens", "--seed", "-1", "--temp", "-3", "--top-p", "0x1p-1",
                                "--dry-base", "0.5", "--sampler-seq", "kqt", "--samplers", "Top-K;nucleus;bogus",
                                "-r", "a\\tb", "--dry-sequence-breaker", "x", "--dry-sequence-breaker", "y",
                                "-a", " m1 , m0,m1", "-to", "30", "-ngl", "all", "-l", "7-0.5",
                                "--chat-template-kwargs", '{"k": {"x": "é"}}', "-rea", "on",
                                "--reasoning-effort", "high"])
    assert (p.n_ctx, p.seed, p.temp, p.top_p, p.dry_base) == (4096, 0xFFFFFFFF, 0.0, 0.5, 1.75)
    assert p.samplers == ("top_k", "top_p")  # --samplers replaces --sampler-seq; unknown names skipped
    assert (p.antiprompt, p.dry_sequence_breakers) == (("a\tb",), ("x", "y"))  # -e is on by default
    assert (p.model_alias, p.timeout_read, p.timeout_write, p.n_gpu_layers) == (("m0", "m1"), 30, 30, -1)
    assert p.logit_bias == ((7, -0.5),)
    assert p.default_template_kwargs == {"k": '{"x":"é"}', "enable_thinking": "true",
                                         "reasoning_effort": '"high"', "preserve_reasoning": "true"}
    assert ServerParams.from_args(["--no-escape", "-r", "a\\tb"]).antiprompt == ("a\\tb",)
    assert ServerParams.from_args(["--dry-sequence-breaker", "none"]).dry_sequence_breakers == ()
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1\n\nk2\n")
    assert ServerParams.from_args(["--api-key-file", str(keys)]).api_keys == ("k1", "k2")
    assert ServerParams.from_args(["--api-key-file", str(keys)]).api_key == "k1"  # never an open server


@pytest.mark.parametrize("args,message", [
    (["-c", "lots"], "-c: invalid value 'lots'"),
    (["--top-k", "many"], "--top-k: invalid value"),
    (["--temp", "hot"], "--temp: invalid value 'hot'"),
    (["--seed", "x"], "--seed: invalid value"),
    (["-t", "99999999999"], "-t: invalid value"),  # std::stoi: out of range
    (["-fa", "maybe"], "-fa: invalid value 'maybe'"),
    (["-ctk", "q9_9"], "-ctk: invalid value 'q9_9'"),
    (["--numa", "spread"], "--numa: invalid value"),
    (["-rea", "sometimes"], "-rea: invalid value 'sometimes'"),
    (["--reasoning-format", "json"], "--reasoning-format: Unknown reasoning format: json"),
    (["--repeat-last-n", "-1"], "--repeat-last-n: error: invalid repeat-last-n = -1"),
    (["--repeat-penalty", "0"], "--repeat-penalty: error: repeat-penalty must be finite and greater than 0"),
    (["--presence-penalty", "inf"], "--presence-penalty: error: presence-penalty must be finite"),
    (["--reasoning-budget", "-2"], "--reasoning-budget"),
    (["-l", "15*2"], "-l: invalid value '15\\*2' \\(invalid input format\\)"),
    (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs: invalid value"),
    (["-j", "{not json"], "-j: invalid value"),
    (["--chat-template-file", "/no/such/file.jinja"], "failed to open file '/no/such/file.jinja'"),
    (["--spec-type", "psychic"], "--spec-type: unknown speculative decoding type psychic"),
    (["--spec-ngram-size-n", "4"], 'error while handling argument "--spec-ngram-size-n": the argument has been removed'),
    (["--grp-attn-n", "4"], "unknown or unsupported llama-server flag: --grp-attn-n"),  # not a server option here
    (["--temp"], "--temp needs a value"),
    (["--jinja=1"], "--jinja takes no value"),
    (["-hf", "ggml-org/gemma"], "-hf: slotlab never downloads a model; .* pass -m PATH"),
])
def test_bad_values_name_the_flag(args, message):
    with pytest.raises(ConfigError, match=message):
        ServerParams.from_args(args)


# --- request defaults --------------------------------------------------------------------------------

def test_sampling_defaults_are_the_tables_defaults():
    """Each request default with no flag is the common_params default the generator read from common.h."""
    d = sampling_defaults(ServerParams())
    by_field = {o.field: o for o in TABLE if o.field}
    checked = 0
    for fld, req in REQUEST_FIELDS.items():
        o = by_field.get(f"sampling.{fld}") or by_field.get(fld)
        if o is None or o.default is None or fld in ("n_predict",):
            continue
        want = V.f32(o.default) if isinstance(o.default, float) else o.default
        assert d[req] == want, (req, d[req], want)
        checked += 1
    assert checked >= 28


@pytest.mark.parametrize("case", json.loads(PROPS.read_text()), ids=lambda c: " ".join(c["flags"])[:40] or "none")
def test_sampling_defaults_match_the_real_servers_props(case):
    """/props default_generation_settings.params as the real llama-server reported it for these flags."""
    got = sampling_defaults(ServerParams.from_args(case["flags"]))
    want = case["params"]
    keys = SAMPLING_REQUEST_KEYS & set(want)
    assert len(keys) >= 25
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}


def test_model_metadata_fills_what_the_flags_left():
    meta = {"general.sampling.temp": "0.6", "general.sampling.top_k": 20, "general.sampling.top_p": "junk",
            "general.sampling.sequence": "top_k;temp"}
    d = sampling_defaults(ServerParams.from_args(["--top-k", "5"]), meta)
    assert (d["temperature"], d["top_k"], d["top_p"], d["samplers"]) == (V.f32(0.6), 5, V.f32(0.95),
                                                                         ["top_k", "temperature"])


# --- a production command line starts `slotlab serve` -------------------------------------------------

def test_production_command_line_starts_slotlab_serve(tmp_path):
    """llama.cpp's tools/server/README.md command (`-m MODEL -c 2048`) with the flags its own server tests
    pass (tools/server/tests/utils.py); /health answers, the unsupported features are named, and
    --log-file receives the server's log lines."""
    from slotlab.llama.model import default_model_path
    from tests.golden.llama_server import LlamaServer, slotlab_serve_command

    log_file = tmp_path / "server.log"
    flags = ["-c", "2048", "--temp", "0.8", "--seed", "42", "--alias", "tinyllama-2", "--batch-size", "32",
             "--ubatch-size", "32", "--cont-batching", "--slots", "--jinja", "--reasoning-format", "none",
             "-np", "2", "-n", "64", "--cors-origins", "*", "-fa", "auto", "-ctk", "f16", "--no-ui", "--props",
             "--sleep-idle-seconds", "60", "--context-shift", "-to", "600", "--log-file", str(log_file),
             "--offline"]
    with LlamaServer(default_model_path(), flags, log=tmp_path / "stderr.log",
                     command=slotlab_serve_command()) as srv:
        assert srv.get("/health") == (200, {"status": "ok"})
    out = (tmp_path / "stderr.log").read_text()
    assert "not supported: --context-shift: context shift is not modelled" in out
    assert "not supported: --sleep-idle-seconds" not in out  # modelled (slotlab/serve/sleep.py)
    assert "note: --offline: slotlab never downloads; ignored" in out
    assert "-fa:" not in out and "-ctk:" not in out  # modelled: they set the KV bytes (no note)
    log = log_file.read_text()
    assert re.search(r"I srv +llama_server: model loaded", log) and "listening on http://127.0.0.1" in log
