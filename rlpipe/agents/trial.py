"""One trial: a task attempted once by one agent in a sandbox, judged by the task's tests.

    1. skip the task when the agent cannot attempt it, or the backend's sandboxes lack a
       command it needs (records.TrialVerdict.SKIPPED, with the reason);
    2. the task's environment on this backend (agents/task_env.py): its work dir (/work, or
       e.g. /app: the same folder seen there too, the agent's cwd, named in the system
       prompt), variables and, on docker, image (a Dockerfile built); a sandbox with the
       task's quotas (memory, storage, CPUs on docker, a command timeout, no network); the
       initial files go to the work dir, execute bits restored, a Dockerfile's RUN steps
       run on bubblewrap, and the task's setup script (if any) runs once, then is deleted;
    3. the episode: the agent sees the system prompt (tools and call format), the
       instruction, and after each reply the tool's result (or why its call was malformed);
       it ends on `submit`, after `max_steps` replies, when the agent time limit passes,
       or after MAX_MALFORMED_IN_A_ROW malformed calls in a row;
    4. a snapshot of /work; the verifier's sandbox holds that state and nothing the agent
       started (backends.verifier_sandbox); the tests arrive only now, read-only at /tests,
       and test.sh runs (cwd /work) with the verifier's time limit (agents/verifier.py);
    5. the reward, read by rlpipe once the tests are gone: Harbor's /logs/verifier/reward.txt
       (a number) or reward.json ({"reward": x}); passed iff reward >= 1. Tests that time
       out or leave no readable reward score 0: the agent's failure, never infrastructure.

Harbor runs tests from /tests and reads /logs/verifier: both are where test.sh expects
them, so a Harbor test.sh runs unchanged (agents/verifier.py says what it may trust).

What it does not do: retry (an infrastructure failure is returned as such; agents/evaluation.py
retries it), record trajectories in the lake (agents/recording.py), or talk to a model
(agents/agents.py). The sandboxes come from a TrialBackend (agents/backends.py): a name
gives the real bwrap or docker backend.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass

from rlpipe.agents.agents import Agent, AgentFactory, AgentUnavailable, ContextExhausted, Message
from rlpipe.agents.backends import TrialBackend, sandbox_limits, trial_backend
from rlpipe.agents.records import Ending, TrialResult, TrialStep, TrialVerdict
from rlpipe.agents.task_format import AgentTask, SkippedTask
from rlpipe.agents.tools import TOOL_SCHEMAS, MalformedCall, ToolCall, parse_tool_call
from rlpipe.agents.tree_state import ReplayDiverged, ReplayPrefix, tree_digest
from rlpipe.agents.verifier import run_tests, tail
from rlpipe.core.errors import AgentStateError, EngineFailed, InfraError
from rlpipe.agents.dockerfile import Files
from rlpipe.agents.task_env import PreparedEnvironment, prepare_environment
from rlpipe.sandbox.base import WORK, ExecResult, Sandbox

MAX_MALFORMED_IN_A_ROW = 3
SYSTEM_PROMPT = """You are an agent working in a Linux sandbox. Your working directory is /work; there is no network.
Answer every turn with exactly one tool call, a JSON object {"name": TOOL, "arguments": {...}}, and nothing after it.
Tools:
""" + "\n".join(json.dumps(schema["function"]) for schema in TOOL_SCHEMAS) + """
Example: {"name": "bash", "arguments": {"command": "ls -la"}}
Call submit when the task is done; tests then check the files in /work."""


def system_prompt(workdir: str = WORK) -> str:
    """SYSTEM_PROMPT with the task's working directory (its files' folder) in place of /work."""
    return SYSTEM_PROMPT if workdir == WORK else SYSTEM_PROMPT.replace("/work", workdir)


@dataclass(frozen=True)
class TrialOptions:
    """How a trial runs beyond the task's own limits."""

    command_timeout_s: float = 120.0  # one bash call, at most (and never past the agent's time limit)
    max_observation_chars: int = 8000  # a tool result longer than this is cut in the middle
    max_malformed_in_a_row: int = MAX_MALFORMED_IN_A_ROW
    tree_digests: bool = True  # a digest of /work after each tool call, so the trial can be replayed (tree_state.py)


def run_trial(task: AgentTask | SkippedTask, agent_name: str, agent_factory: AgentFactory, backend: str | TrialBackend,
              options: TrialOptions = TrialOptions(), replay: ReplayPrefix | None = None) -> TrialResult:
    """Attempt `task` once; every outcome, including infrastructure failures, is a TrialResult.
    With `replay`, its recorded steps are re-executed first and the agent goes on from there
    (ReplayDiverged when a step's /work differs from the recorded digest)."""
    sandboxes = trial_backend(backend)
    backend = sandboxes.name
    started = time.monotonic()
    started_at_ms = int(time.time() * 1000)

    def result(verdict: TrialVerdict, detail: str, **fields) -> TrialResult:
        fields.setdefault("ending", Ending.NOT_STARTED)
        if replay is not None:
            fields.update(replay_of=replay.source_trial_id, replay_from_step=len(replay.steps))
        return TrialResult(task.task_id, agent_name, backend, verdict, reward=fields.pop("reward", None), detail=detail,
                           duration_s=time.monotonic() - started, started_at_ms=started_at_ms, **fields)

    if isinstance(task, SkippedTask):
        return result(TrialVerdict.INVALID_TASK if task.invalid else TrialVerdict.SKIPPED, task.reason)
    try:
        agent = agent_factory(task)
    except AgentUnavailable as exc:
        return result(TrialVerdict.SKIPPED, f"agent {agent_name}: {exc}")
    try:
        prepared = prepare_environment(backend, task)
        if isinstance(prepared, str):
            return result(TrialVerdict.SKIPPED, prepared)
        needed = {*task.requires_commands, *prepared.commands}
        present = sandboxes.available_commands([*needed, "bash", "python3"], prepared.workspace)
    except InfraError as exc:
        return result(TrialVerdict.SANDBOX_ERROR, f"cannot prepare or probe the {backend} sandbox: {exc.message}")
    except Exception as exc:  # noqa: BLE001 - rlpipe's own failure: recorded (and retried), never a lost trial
        return result(TrialVerdict.SANDBOX_ERROR, f"rlpipe failed to prepare the task's environment: {type(exc).__name__}: {exc}")
    missing = sorted(needed - present)
    if missing:
        return result(TrialVerdict.SKIPPED, f"needs {', '.join(missing)}, which the {backend} sandbox lacks")
    notes = "; ".join(prepared.notes)
    shell = "bash" if "bash" in present else "sh"
    limits = sandbox_limits(task.limits, timeout_s=min(options.command_timeout_s, task.limits.agent_timeout_s))
    sandbox: Sandbox | None = None
    try:
        sandbox = sandboxes.open(limits, task.limits.cpus, prepared.workspace)
        setup_failure = _prepare(sandbox, task, prepared, shell)
        if setup_failure:
            return result(TrialVerdict.SETUP_ERROR, setup_failure)
        agent_started = time.monotonic()
        ending, steps, malformed, detail = _run_episode(agent, sandbox, task, shell, options, replay, prepared.workspace.path)
        agent_duration_s = time.monotonic() - agent_started
        common = {"ending": ending, "steps": tuple(steps), "malformed_counts": malformed, "agent_duration_s": agent_duration_s}
        if ending in (Ending.ENGINE_ERROR, Ending.SANDBOX_ERROR):
            return result(TrialVerdict(ending.value), detail, **common)
        verifier_started = time.monotonic()
        try:
            final = sandbox.snapshot()
            tests = run_tests(sandboxes, sandbox, final, task, limits, prepared.workspace)
        except AgentStateError as exc:  # a /work its own state made uncopyable: abstention scores zero
            return result(TrialVerdict.FAILED, f"the final state cannot be verified: {exc.message}", reward=0.0,
                          verifier_duration_s=time.monotonic() - verifier_started, **common)
        verdict = tests.verdict or _agent_verdict(tests.reward, ending)
        return result(verdict, "; ".join(part for part in (detail, tests.detail, notes) if part), reward=tests.reward,
                      verifier_duration_s=time.monotonic() - verifier_started, **common)
    except InfraError as exc:
        return result(TrialVerdict.SANDBOX_ERROR, f"{type(exc).__name__}: {exc.message}")
    except ReplayDiverged:
        raise
    except Exception as exc:  # noqa: BLE001 - rlpipe's own failure: recorded (and retried), never a lost trial
        return result(TrialVerdict.SANDBOX_ERROR, f"rlpipe failed during the trial: {type(exc).__name__}: {exc}")
    finally:
        if sandbox is not None:
            sandbox.close()


def _agent_verdict(reward: float, ending: Ending) -> TrialVerdict:
    if reward >= 1.0:
        return TrialVerdict.PASSED
    if ending is Ending.SUBMITTED:
        return TrialVerdict.FAILED
    return TrialVerdict(ending.value)


def _prepare(sandbox: Sandbox, task: AgentTask, prepared: PreparedEnvironment, shell: str) -> str:
    """The environment's steps (initial files with their execute bits, a Dockerfile's RUN
    lines on bubblewrap), then the setup script; '' or why the setup failed."""
    for step in prepared.steps:
        if isinstance(step, Files):
            sandbox.write_files(dict(step.files))
            if step.executable:
                chmod = "import os, sys\nfor path in sys.argv[1:]: os.chmod(os.path.join('/work', path), 0o755)"
                done = sandbox.exec(["python3", "-I", "-c", chmod, *step.executable])
                if done.exit_code != 0:
                    return f"could not restore execute bits: {tail(done.stderr)}"
            continue
        ran = sandbox.exec(["sh", "-c", step.command], timeout_s=task.limits.verifier_timeout_s)
        if ran.exit_code != 0:
            return (f"environment/Dockerfile's RUN {step.command[:200]!r} exited {ran.exit_code} (timed out: "
                    f"{ran.timed_out}): {tail(ran.stdout + ran.stderr)}")
    if task.setup_script is None:
        return ""
    ran = sandbox.exec([shell, task.setup_script], timeout_s=task.limits.verifier_timeout_s)
    if ran.exit_code != 0:
        return f"setup script {task.setup_script} exited {ran.exit_code} (timed out: {ran.timed_out}): {tail(ran.stdout + ran.stderr)}"
    sandbox.exec(["python3", "-I", "-c", "import os, sys; os.remove(sys.argv[1])", task.setup_script])
    return ""


def _run_episode(agent: Agent, sandbox: Sandbox, task: AgentTask, shell: str, options: TrialOptions,
                 replay: ReplayPrefix | None = None, workdir: str = WORK) -> tuple[Ending, list[TrialStep], dict[str, int], str]:
    """The observe -> act -> execute loop; (ending, steps, malformed counts by kind, detail)."""
    episode_started = time.monotonic()
    deadline = episode_started + task.limits.agent_timeout_s
    messages = [Message("system", system_prompt(workdir)), Message("user", task.instruction)]
    steps: list[TrialStep] = []
    malformed: dict[str, int] = {}
    in_a_row = 0
    if replay is not None:
        _replay_steps(replay, sandbox, shell, deadline, options, episode_started, messages, steps, malformed, workdir)
    for index in range(len(steps), int(task.limits.max_steps)):
        if time.monotonic() >= deadline:
            return Ending.AGENT_TIMEOUT, steps, malformed, ""
        step_started = time.monotonic()
        try:
            reply = agent.act(tuple(messages))
        except (EngineFailed, InfraError) as exc:
            return Ending.ENGINE_ERROR, steps, malformed, f"the agent's engine failed: {exc.message}"
        except ContextExhausted as exc:
            return Ending.CONTEXT_EXHAUSTED, steps, malformed, str(exc)
        except Exception as exc:  # noqa: BLE001 - an agent's own bug ends its episode, never the eval
            return Ending.AGENT_ERROR, steps, malformed, f"the agent raised {type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            return Ending.AGENT_TIMEOUT, steps, malformed, "the time limit passed while the agent thought"
        messages.append(Message("assistant", reply if isinstance(reply, str) else repr(reply)))
        call = parse_tool_call(reply)
        if isinstance(call, MalformedCall):
            malformed[call.kind] = malformed.get(call.kind, 0) + 1
            in_a_row += 1
            observation = f"error: malformed tool call ({call.kind}): {call.detail}"
            steps.append(TrialStep(index, str(reply), None, {}, call.kind, observation, None, False, **_timing(episode_started, step_started)))
            messages.append(Message("tool", observation))
            if in_a_row >= options.max_malformed_in_a_row:
                return Ending.MALFORMED_CALLS, steps, malformed, f"{in_a_row} malformed calls in a row"
            continue
        in_a_row = 0
        if call.name == "submit":
            steps.append(TrialStep(index, reply, "submit", {}, None, "", None, False, **_timing(episode_started, step_started)))
            return Ending.SUBMITTED, steps, malformed, ""
        observation, exit_code, tool_error = _execute(call, sandbox, shell, deadline, options, workdir)
        digest = tree_digest(sandbox) if options.tree_digests else None
        steps.append(TrialStep(index, reply, call.name, call.arguments, None, observation, exit_code, tool_error,
                               **_timing(episode_started, step_started), tree_sha256=digest))
        messages.append(Message("tool", observation))
    return Ending.MAX_STEPS, steps, malformed, f"no submit within {int(task.limits.max_steps)} steps"


def _replay_steps(replay: ReplayPrefix, sandbox: Sandbox, shell: str, deadline: float, options: TrialOptions,
                  episode_started: float, messages: list[Message], steps: list[TrialStep], malformed: dict[str, int],
                  workdir: str = WORK) -> None:
    """Re-execute the recorded steps (agents/tree_state.py): the same calls, in order, each
    /work digest checked against the recorded one; the conversation as the agent would have
    seen it (the re-executed results)."""
    for index, recorded in enumerate(replay.steps):
        step_started = time.monotonic()
        messages.append(Message("assistant", recorded.reply))
        if recorded.tool is None:
            malformed[recorded.malformed_kind or "no_call"] = malformed.get(recorded.malformed_kind or "no_call", 0) + 1
            steps.append(dataclasses.replace(recorded, index=index, **_timing(episode_started, step_started)))
            messages.append(Message("tool", recorded.observation))
            continue
        if recorded.tool == "submit":
            raise ReplayDiverged(f"step {index + 1} of trial {replay.source_trial_id} is its submit: there is nothing to "
                                 "continue after it", hint=f"replay from step {index} or earlier")
        call = ToolCall(recorded.tool, dict(recorded.arguments))
        observation, exit_code, tool_error = _execute(call, sandbox, shell, deadline, options, workdir)
        digest = tree_digest(sandbox)
        if recorded.tree_sha256 is not None and digest != recorded.tree_sha256:
            raise ReplayDiverged(
                f"re-executing step {index + 1} of trial {replay.source_trial_id} ({recorded.tool} "
                f"{json.dumps(recorded.arguments)[:200]}) left /work with digest {digest}, not the recorded "
                f"{recorded.tree_sha256}: the step is not deterministic, so the state after it cannot be restored",
                hint=f"replay from an earlier step (before step {index + 1})")
        steps.append(TrialStep(index, recorded.reply, call.name, call.arguments, None, observation, exit_code, tool_error,
                               **_timing(episode_started, step_started), tree_sha256=digest))
        messages.append(Message("tool", observation))


def _timing(episode_started: float, step_started: float) -> dict[str, float]:
    return {"duration_s": time.monotonic() - step_started, "started_s": step_started - episode_started}


def _execute(call: ToolCall, sandbox: Sandbox, shell: str, deadline: float, options: TrialOptions,
             workdir: str = WORK) -> tuple[str, int | None, bool]:
    """Run one well-formed call: (observation, exit code for bash, whether the tool failed)."""
    if call.name == "bash":
        timeout_s = max(0.1, min(options.command_timeout_s, deadline - time.monotonic()))
        try:
            ran = sandbox.exec([shell, "-c", call.arguments["command"]], timeout_s=timeout_s)
        except ValueError as exc:  # a command no process can take (parse_tool_call refuses the known ones)
            return f"error: bash: {exc}", None, True
        return _bash_observation(ran, options.max_observation_chars), ran.exit_code, ran.exit_code != 0
    path = _work_relative(call.arguments["path"], workdir)
    try:
        if call.name == "read_file":
            content = sandbox.read_file(path).decode("utf-8", errors="replace")
            return _cut(content, options.max_observation_chars), None, False
        sandbox.write_files({path: call.arguments["content"].encode()})
        return f"wrote {len(call.arguments['content'].encode())} bytes to {workdir}/{path}", None, False
    except (OSError, ValueError, RuntimeError) as exc:  # a missing file, a path outside /work, a link
        return f"error: {call.name} {call.arguments['path']!r}: {exc}", None, True


def _work_relative(path: str, workdir: str = WORK) -> str:
    """`/work/a/b`, `{workdir}/a/b` or `./a/b` -> `a/b` (anything else is passed on and refused by the sandbox)."""
    path = path.strip()
    for prefix in {WORK + "/", workdir.rstrip("/") + "/"}:
        if path.startswith(prefix):
            return path[len(prefix):]
    return path[2:] if path.startswith("./") else path


def _bash_observation(ran: ExecResult, max_chars: int) -> str:
    status = "timed out (killed)" if ran.timed_out else ("killed: out of memory" if ran.oom_killed else str(ran.exit_code))
    text = f"exit_code: {status}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
    return _cut(text, max_chars)


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
