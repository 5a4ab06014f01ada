"""A task's environment on one backend: the workspace its sandboxes get and the steps before the agent.

`prepare_environment(backend, task)` gives a PreparedEnvironment, or a skip reason (str):

- a task without environment/Dockerfile: its environment/ files go into the work dir
  (execute bits restored), seen at the task's work dir (task_format: /work for the
  built-in suite, /app for a task that names /app, or task.toml's workdir);
- with a Dockerfile, on docker: the image is built (sandbox/docker_task_image.py, cached
  by the context's digest) and the trial runs in it: its WORKDIR is the work dir, its ENV
  every command's, the files it left under the WORKDIR the initial files. A base that is
  not on the engine, a failed offline build, or an image without python3 is a skip;
- with a Dockerfile, on bubblewrap (or any other backend, which runs on the host's /usr):
  the steps agents/dockerfile.py can honour (WORKDIR, ENV, COPY of the context, RUN of
  host commands, in order), FROM ignored with a note; any other step is a skip.

What it does not: open sandboxes, run the steps (the trial does, before the agent starts),
or check that a RUN step's commands exist (the trial asks the backend: `commands`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpipe.agents.dockerfile import Files, Run, Unsupported, bwrap_plan
from rlpipe.agents.task_format import AgentTask
from rlpipe.sandbox.base import Workspace, workspace_problem


@dataclass(frozen=True)
class PreparedEnvironment:
    """What a trial's sandboxes get, and what runs in them before the agent (in order)."""

    workspace: Workspace
    steps: tuple[Run | Files, ...]
    commands: tuple[str, ...] = ()  # what the RUN steps call: the sandbox must have them
    notes: tuple[str, ...] = ()  # said in the trial's detail (e.g. FROM ignored on bubblewrap)


def prepare_environment(backend: str, task: AgentTask) -> PreparedEnvironment | str:
    """The environment of `task` on `backend`, or why the task is skipped there. May raise
    InfraError (e.g. SandboxUnavailable: no docker engine), which is the host's failure."""
    if task.dockerfile is None:
        return PreparedEnvironment(Workspace(task.workdir), (Files(dict(task.initial_files), task.executable_files),))
    if backend == "docker":
        return _docker(task)
    try:
        plan = bwrap_plan(task.dockerfile, task.initial_files, task.executable_files, task.workdir)
    except Unsupported as exc:
        return str(exc)
    workspace = Workspace(task.workdir, tuple(plan.env.items()))
    return PreparedEnvironment(workspace, tuple(plan.steps), tuple(sorted(plan.commands)), tuple(plan.notes))


def _docker(task: AgentTask) -> PreparedEnvironment | str:
    from rlpipe.sandbox.docker_engine import docker_client
    from rlpipe.sandbox.docker_task_image import TaskImageUnavailable, build_task_image

    try:
        image = build_task_image(docker_client(None), task.initial_files, task.executable_files)
    except TaskImageUnavailable as exc:
        return str(exc)
    problem = workspace_problem(image.workdir)
    if problem:
        return f"the task image's WORKDIR: {problem}"
    return PreparedEnvironment(Workspace(image.workdir, image=image.tag), (Files(image.files, image.executable),))
