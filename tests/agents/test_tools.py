"""Tool-call parsing: the forms chat models write, and each kind of malformed or adversarial reply."""

from __future__ import annotations

import pytest

from rlpipe.agents.tools import MALFORMED_KINDS, MalformedCall, ToolCall, parse_tool_call, tool_call_json


@pytest.mark.parametrize("reply", [
    '{"name": "bash", "arguments": {"command": "ls"}}',
    'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
    'I will list the files:\n```json\n{"name": "bash", "arguments": {"command": "ls"}}\n```\nthen read them.',
    '{"tool": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}',  # OpenAI sends arguments as a JSON string
    'thinking {not json} ... {"name": "bash", "arguments": {"command": "ls"}}',
])
def test_well_formed_calls_in_the_usual_wrappings_parse(reply):
    assert parse_tool_call(reply) == ToolCall("bash", {"command": "ls"})


def test_braces_inside_strings_and_a_second_call_are_handled():
    reply = tool_call_json("write_file", path="a.json", content='{"x": "}"}') + "\n" + tool_call_json("submit")
    call = parse_tool_call(reply)
    assert call == ToolCall("write_file", {"path": "a.json", "content": '{"x": "}"}'}, extra_calls=1)


def test_submit_takes_no_arguments_and_null_arguments_are_none():
    assert parse_tool_call('{"name": "submit"}') == ToolCall("submit", {})
    assert parse_tool_call('{"name": "submit", "arguments": null}') == ToolCall("submit", {})


@pytest.mark.parametrize(("reply", "kind"), [
    ("I think the answer is 42.", "no_call"),
    ("", "no_call"),
    ('{"name": "bash", "arguments": {"command": "ls"}', "invalid_json"),  # unclosed
    ("{'name': 'bash'}", "invalid_json"),  # Python, not JSON
    ('{"command": "ls"}', "not_an_object"),  # no tool name
    ('{"name": "rm_rf", "arguments": {}}', "unknown_tool"),
    ('{"name": ["bash"], "arguments": {}}', "unknown_tool"),
    ('{"name": "bash", "arguments": {}}', "bad_arguments"),  # missing command
    ('{"name": "bash", "arguments": {"command": ["ls", "-l"]}}', "bad_arguments"),  # not a string
    ('{"name": "read_file", "arguments": {"path": "a", "mode": "rb"}}', "bad_arguments"),  # unknown key
    ('{"name": "bash", "arguments": "not json"}', "bad_arguments"),
    ('{"name": "bash", "arguments": 7}', "bad_arguments"),
    ("[" * 100_000, "no_call"),
    ("{" * 100_000, "invalid_json"),  # deep nesting: no RecursionError escapes
])
def test_malformed_replies_give_their_kind_and_never_raise(reply, kind):
    call = parse_tool_call(reply)
    assert isinstance(call, MalformedCall) and call.kind == kind and kind in MALFORMED_KINDS
    assert call.detail


def test_a_non_text_reply_is_malformed():
    assert parse_tool_call(None).kind == "no_call"  # type: ignore[arg-type]
