"""Chat templates render as the real llama-server renders them: the same prompt text and the same
prompt tokens, for the real Jinja templates of several model families and for the template flags
(`--jinja` / `--no-jinja`, `--chat-template NAME|JINJA`, `--chat-template-file`).

The server's answers were recorded by tests/serve/record_templates.py (each family's template written
into a copy of the default model's GGUF); here slotlab renders each recorded request again, without
a server, and tokenizes with the default model as the server's chat path does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlab.engine.params import ServerParams
from slotlab.llama import Model
from slotlab.llama.model import default_model_path
from slotlab.serve.chat import ChatTemplate, ChatTemplateError
from slotlab.serve.chat_request import ChatRequestError
from tests.serve.gguf_with_template import write_with_template

GOLDEN = Path(__file__).with_name("golden_templates")
RECORDS = {p.stem: json.loads(p.read_text()) for p in sorted(GOLDEN.glob("*.json"))}
CASES = [(name, c["conversation"]) for name, rec in RECORDS.items() for c in rec["cases"]]


class WithTemplate:
    """The default model as a GGUF whose `tokenizer.chat_template` is `template` would be (the
    recorder's copies are not kept; test_gguf_copy_reads_back checks one for real)."""

    def __init__(self, model: Model, template: str | None):
        self._model, self._template = model, template

    def chat_template(self):
        return self._template

    def __getattr__(self, name):
        return getattr(self._model, name)


def _flags(rec: dict, tmp: Path) -> list[str]:
    out = []
    for f in rec["flags"]:
        if f.startswith("@"):
            path = tmp / f[1:]
            path.write_text(rec["flag_files"][f[1:]], encoding="utf-8")
            f = str(path)
        out.append(f)
    return out


@pytest.fixture(scope="module")
def templates(model, tmp_path_factory):
    """One ChatTemplate per recorded configuration, built from the recorded flags by the real parser."""
    tmp = tmp_path_factory.mktemp("chat-templates")
    built = {}

    def get(name: str) -> ChatTemplate:
        if name not in built:
            rec = RECORDS[name]
            params = ServerParams.from_args(_flags(rec, tmp))
            built[name] = ChatTemplate(WithTemplate(model, rec["gguf_template"]), params)
        return built[name]
    return get


def _case(name: str, conv: str) -> dict:
    return next(c for c in RECORDS[name]["cases"] if c["conversation"] == conv)


@pytest.mark.parametrize("name,conv", CASES)
def test_prompt_and_tokens_equal_the_servers(templates, model, name, conv):
    case = _case(name, conv)
    chat = templates(name)
    if case["status"] != 200:
        with pytest.raises((ChatRequestError, ChatTemplateError)) as ei:
            chat.apply_request(case["request"], now=case["time"])
        assert str(ei.value) == case["error"]["error"]["message"]
        assert getattr(ei.value, "code", 500) == case["status"]
        return
    prompt = chat.apply_request(case["request"], now=case["time"])
    assert prompt == case["prompt"]
    tokens = model.tokenize(prompt, add_special=True, parse_special=True).tolist()
    assert tokens == case["tokens"]
    assert len(tokens) == case["prompt_tokens"]  # the chat completion's usage.prompt_tokens


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_template_source_is_the_one_props_shows(templates, name):
    assert templates(name).source == RECORDS[name]["props_chat_template"]


def test_the_recordings_cover_six_families_and_the_flags():
    families = {"gemma", "qwen", "llama", "mistral", "phi", "deepseek", "gpt-oss"}
    seen = {f for rec in RECORDS.values() if rec["template_file"] for f in families
            if f in rec["template_file"].lower()}
    assert len(seen) >= 6, seen
    flags = {f for rec in RECORDS.values() for f in rec["flags"]}
    assert {"--no-jinja", "--chat-template", "--chat-template-file"} <= flags
    # every recording renders something for most conversations (the comparison above is not vacuous)
    assert sum(c["status"] == 200 for rec in RECORDS.values() for c in rec["cases"]) >= 100


def test_gguf_copy_reads_back(model, tmp_path):
    """The template written into a GGUF copy is what slotlab's model loader gives the renderer."""
    rec = RECORDS["llama3_1"]
    copy = write_with_template(model.path, tmp_path / "llama3_1.gguf", rec["gguf_template"])
    m = Model(copy)
    try:
        chat = ChatTemplate(m, ServerParams.from_args(rec["flags"]))
        case = _case("llama3_1", "multi_turn")
        assert chat.apply_request(case["request"], now=case["time"]) == case["prompt"]
    finally:
        m.close()
        copy.unlink()


def test_a_builtin_name_needs_no_jinja(model):
    with pytest.raises(ValueError, match="the supplied chat template is not supported: no-such-template"):
        ChatTemplate(model, ServerParams.from_args(["--no-jinja", "--chat-template", "no-such-template"]))


def test_apply_keeps_the_chat_paths_api(templates):
    """app.py's chat path: apply(messages), delimiters(), source."""
    chat = templates("default_chatml")
    case = _case("default_chatml", "system_user")
    assert chat.apply(case["request"]["messages"]) == case["prompt"]
    # the autoparser's assistant start, then its user start (tests/serve/test_delimiters.py: as the server logs them)
    assert chat.delimiters() == [{"role": "assistant", "delimiter": "<|im_start|>assistant"},
                                 {"role": "user", "delimiter": "<|im_start|>user"}]
    assert chat.is_default and chat.source.startswith("{%- for message in messages -%}")


def test_apply_template_endpoint_answers_like_the_server(tmp_path):
    """`slotlab serve --chat-template-file F` answers /apply-template with the server's prompts and errors."""
    from tests.golden.llama_server import LlamaServer, slotlab_serve_command

    rec = RECORDS["flag_file_phi3_5"]
    with LlamaServer(default_model_path(), ["-np", "1", "-c", "4096", *_flags(rec, tmp_path)],
                     command=slotlab_serve_command()) as srv:
        for case in rec["cases"]:
            status, body = srv.post("/apply-template", case["request"])
            assert status == case["status"], case["conversation"]
            if status == 200:
                assert body == {"prompt": case["prompt"]}
            else:
                assert body["error"]["message"] == case["error"]["error"]["message"]
        status, props = srv.get("/props")
        assert props["chat_template"] == rec["props_chat_template"]
