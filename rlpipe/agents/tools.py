"""The agent's tools, their JSON schema, and the parser of tool calls in an agent's reply.

An agent answers each turn with exactly one tool call, a JSON object:

    {"name": "bash", "arguments": {"command": "ls -la"}}

`name` may also be spelled `tool`, and `arguments` may be a JSON string (as OpenAI's
function calling sends it). The object may stand alone, sit in a ```json fence, or in
`<tool_call>...</tool_call>` tags (Hermes/Qwen chat templates); text around it is ignored.
The first object that looks like a call is taken; more are counted (`extra_calls`).

Tools (TOOL_SCHEMAS holds the OpenAI-style schemas that a chat template can render):

    bash        {"command": str}             run in /work with bash (sh where bash is absent)
    read_file   {"path": str}                a file under /work
    write_file  {"path": str, "content": str} create or replace a file under /work
    submit      {}                           end the episode; the verifier then judges /work

`parse_tool_call` never raises: a reply that is not one well-formed call gives a
MalformedCall whose `kind` says what was wrong (MALFORMED_KINDS); the loop answers it with
an error observation and counts it. What it does not do: run the tool (agents/trial.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TOOL_SCHEMAS: tuple[dict, ...] = (
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the task's working directory /work; returns exit code, stdout and stderr.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file under /work.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Create or replace a file under /work with the given content.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Finish: the task is done (or you give up). The tests run after this.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
)
TOOL_ARGUMENTS = {schema["function"]["name"]: tuple(schema["function"]["parameters"]["required"]) for schema in TOOL_SCHEMAS}
MALFORMED_KINDS = ("no_call", "invalid_json", "not_an_object", "unknown_tool", "bad_arguments")
MAX_REPLY_CHARS = 200_000  # longer replies are cut before parsing (a runaway generation)
CHAT_SYSTEM_PROMPT = """You are an agent in a Linux sandbox; your working directory is /work.
Answer every turn with exactly one tool call, a JSON object {"name": TOOL, "arguments": {...}}, and nothing after it.
Tools: bash {"command"}, read_file {"path"}, write_file {"path", "content"}, submit {}.
Call submit when the task is done."""
"""The short system prompt of chat episodes in training (agents/episodes.py), a few dozen
tokens where the suite's (agents/trial.py SYSTEM_PROMPT, with the schemas) has ~300; the
policy agent of `rlpipe eval --system-prompt training` uses it in place of the suite's."""

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a known tool with the arguments its schema requires (strings)."""

    name: str
    arguments: dict[str, str]
    extra_calls: int = 0  # further calls in the same reply, ignored


@dataclass(frozen=True)
class MalformedCall:
    """A reply that is not one well-formed call: `kind` in MALFORMED_KINDS, and why."""

    kind: str
    detail: str


def tool_call_json(name: str, **arguments: str) -> str:
    """The canonical text of a call (what scripted agents reply)."""
    return json.dumps({"name": name, "arguments": arguments})


def parse_tool_call(reply: str) -> ToolCall | MalformedCall:
    """The tool call in an agent's reply, or what is wrong with it."""
    if not isinstance(reply, str):
        return MalformedCall("no_call", f"the reply is a {type(reply).__name__}, not text")
    text = reply[:MAX_REPLY_CHARS]
    candidates = _candidates(text)
    if not candidates:
        return MalformedCall("no_call", "no JSON object in the reply; answer with {\"name\": TOOL, \"arguments\": {...}}")
    decoded = []
    first_error = ""
    for candidate in candidates:
        try:
            decoded.append(json.loads(candidate))
        except (json.JSONDecodeError, RecursionError) as exc:
            first_error = first_error or f"invalid JSON: {getattr(exc, 'msg', 'nested too deep')}"
    calls = [value for value in decoded if isinstance(value, dict) and ("name" in value or "tool" in value)]
    if not calls:
        if decoded:
            return MalformedCall("not_an_object", "the JSON is not an object with a \"name\" (the tool) and \"arguments\"")
        return MalformedCall("invalid_json", first_error)
    return _validate(calls[0], extra_calls=len(calls) - 1)


def _candidates(text: str) -> list[str]:
    """JSON texts to try, in order: <tool_call> tags, ``` fences, then balanced {...} spans."""
    tagged = [match.group(1) for match in _TAGGED.finditer(text) if match.group(1).strip()]
    if tagged:
        return tagged
    fenced = [match.group(1) for match in _FENCED.finditer(text) if match.group(1).strip().startswith("{")]
    if fenced:
        return fenced
    return _balanced_objects(text)


def _balanced_objects(text: str) -> list[str]:
    """Top-level `{...}` spans of text, braces inside JSON strings ignored."""
    spans, depth, start, in_string, escaped = [], 0, -1, False, False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"' and depth > 0:
            in_string = True
        elif char == "{":
            if depth == 0:
                start = index
            depth += 1
        elif char == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start:index + 1])
    if depth > 0 and start >= 0:
        spans.append(text[start:])  # an unclosed object: reported as invalid JSON
    return spans


def _validate(call: dict, extra_calls: int) -> ToolCall | MalformedCall:
    name = call.get("name", call.get("tool"))
    if not isinstance(name, str) or name not in TOOL_ARGUMENTS:
        return MalformedCall("unknown_tool", f"unknown tool {name!r}; the tools are {', '.join(TOOL_ARGUMENTS)}")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return MalformedCall("bad_arguments", f"{name}: arguments is a string that is not JSON ({exc.msg})")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return MalformedCall("bad_arguments", f"{name}: arguments must be an object, not {type(arguments).__name__}")
    required = TOOL_ARGUMENTS[name]
    missing = [key for key in required if key not in arguments]
    unknown = [key for key in arguments if key not in required]
    wrong_type = [key for key in required if key in arguments and not isinstance(arguments[key], str)]
    if missing or unknown or wrong_type:
        problems = [f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else "",
                    f"not strings {wrong_type}" if wrong_type else ""]
        return MalformedCall("bad_arguments", f"{name}: arguments {'; '.join(p for p in problems if p)}; "
                                              f"{name} takes {list(required) or 'no arguments'}")
    unusable = [key for key in required if not _passable(key, arguments[key])]
    if unusable:  # a command or path with a NUL, or text with a lone surrogate, cannot reach a process or a file
        return MalformedCall("bad_arguments", f"{name}: {unusable} hold a NUL character or text that is not valid "
                                              "Unicode (a lone surrogate)")
    return ToolCall(name, {key: arguments[key] for key in required}, extra_calls)


def _passable(key: str, value: str) -> bool:
    """Whether an argument can be handed on as it is: valid UTF-8, and no NUL in a command or
    a path (an argv or a file name cannot hold one; a file's content can)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return key == "content" or "\x00" not in value
