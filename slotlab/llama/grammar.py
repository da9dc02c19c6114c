"""JSON schema -> GBNF, as the server's `json_schema_to_grammar` (common/json-schema-to-grammar.cpp).

llama-cpp-python ships a Python port of llama.cpp's converter (`llama_cpp.llama_grammar`); the
server's is C++. tests/serve/test_sampling.py compares the two on the schemas of the server's own
tests, through the grammars the real server logged (tests/serve/golden_sampling.json)."""

from __future__ import annotations

import json


# the C++ converter's whitespace rule (json-schema-to-grammar.cpp SPACE_RULE); the port still has
# its older single optional space, which lets fewer outputs through than the server does
SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'


def json_schema_to_grammar(schema) -> str:
    """The GBNF for `schema` (a dict, or its JSON text). Raises the converter's errors."""
    from llama_cpp.llama_grammar import SchemaConverter

    schema = json.loads(schema) if isinstance(schema, str) else schema
    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    conv._rules["space"] = SPACE_RULE
    schema = conv.resolve_refs(schema, "stdin")
    conv.visit(schema, "")
    return conv.format_grammar()
