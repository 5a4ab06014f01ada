"""Agents behind one small protocol: the conversation so far in, one reply (text) out.

The loop (agents/trial.py) shows an agent the system prompt, the task's instruction and an
observation after each tool call as chat messages, and parses each reply with
tools.parse_tool_call. A model-backed agent is one more implementation: render the
messages with the model's chat template (TOOL_SCHEMAS for its tools), generate, return the
text. An agent is built per trial from the task (`AgentFactory`), so it may hold state for
one episode.

Built in:
- `noop`: submits at once (what doing nothing scores: every task must fail with it);
- `oracle`: runs the task's solution/solve.sh through the bash tool, then submits; a task
  with no solve.sh cannot be run by it (AgentUnavailable: the trial is skipped);
- `ScriptedAgent`: replays a fixed list of replies (tests; malformed ones included).

A model-backed agent (a language model through an engine, with context management) is
agents/policy.py; its engine is built above this layer (controller/eval_policy.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from rlpipe.agents.task_format import AgentTask
from rlpipe.agents.tools import tool_call_json

ORACLE_SOLUTION_DIR = ".oracle-solution"  # under /work while solve.sh runs, removed after


@dataclass(frozen=True)
class Message:
    """One chat message: role in system, user, assistant, tool."""

    role: str
    content: str


class AgentUnavailable(Exception):
    """This agent cannot attempt this task (e.g. the oracle of a task without solve.sh)."""


class ContextExhausted(Exception):
    """The agent's next prompt would not fit its context window or its episode's token budget
    (agents/policy.py): the episode ends with the agent-family verdict context_exhausted."""


class Agent(Protocol):
    def act(self, messages: Sequence[Message]) -> str:
        """The next reply: one tool call as JSON text (see agents/tools.py)."""
        ...


AgentFactory = Callable[[AgentTask], Agent]


class ScriptedAgent:
    """Replies with the given texts in order, then submits."""

    def __init__(self, replies: Sequence[str]) -> None:
        self._replies = list(replies)

    def act(self, messages: Sequence[Message]) -> str:
        return self._replies.pop(0) if self._replies else tool_call_json("submit")


def noop_agent(task: AgentTask) -> Agent:
    return ScriptedAgent([])


def oracle_agent(task: AgentTask) -> Agent:
    """Runs solution/solve.sh (other solution files are written beside it first), then submits."""
    script = task.solution_files.get("solve.sh")
    if script is None:
        raise AgentUnavailable("the task has no solution/solve.sh for the oracle to run")
    text = script.decode("utf-8", errors="replace")
    others = {path: data for path, data in task.solution_files.items() if path != "solve.sh"}
    if not others:
        return ScriptedAgent([tool_call_json("bash", command=text)])
    # Harbor copies solution/ to /solution; here it goes under /work for the run, then away
    where = f"/work/{ORACLE_SOLUTION_DIR}"
    rewritten = re.sub(r"(?<![\w./-])/solution(?=/|\b)", where, text)
    replies = [tool_call_json("write_file", path=f"{ORACLE_SOLUTION_DIR}/{path}", content=data.decode("utf-8", errors="replace"))
               for path, data in others.items()]
    replies.append(tool_call_json("bash", command=f"{rewritten}\n"))
    replies.append(tool_call_json("bash", command=f"python3 -c 'import shutil; shutil.rmtree(\"{where}\")'"))
    return ScriptedAgent(replies)


AGENTS: dict[str, AgentFactory] = {"noop": noop_agent, "oracle": oracle_agent}
