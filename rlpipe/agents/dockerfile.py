"""A task's environment/Dockerfile as steps a bubblewrap sandbox can take, or why it cannot.

Bubblewrap sandboxes see the host's read-only /usr: no image is built. `bwrap_plan` reads
the Dockerfile and keeps what the sandbox can honour, in order:

    FROM          ignored, with a note: the host's /usr stands in for the base image
    WORKDIR       the work dir (the last one; the sandbox binds its work dir there);
                  a RUN under an earlier WORKDIR runs in the work dir (a note says so)
    ENV, ARG      variables of every command (ARG's default; $VAR and ${VAR} expanded)
    COPY, ADD     files of the build context (environment/) to a path under the work dir,
                  written before the next step (a source folder copies its files; --chown
                  is ignored: every file is the sandbox user's)
    RUN           run in the sandbox (sh -c, cwd the work dir, as the sandbox user) before
                  the agent starts; its commands must be on the host (checked per trial),
                  and a package manager or download (apt-get, pip, curl, ...) is a skip:
                  there is no network and /usr is read-only
    LABEL, EXPOSE, CMD, ENTRYPOINT, MAINTAINER, HEALTHCHECK, STOPSIGNAL, VOLUME, SHELL
                  ignored (nothing in a trial starts the image's command)

Any other step is a skip reason naming it: USER, ONBUILD, a second FROM (multi-stage),
COPY --from, ADD of a URL or an archive, a heredoc, a COPY outside the work dir (/usr/...).

What it does not: run anything (agents/task_env.py and the trial do), or build images
(the docker backend builds the real one: sandbox/docker_task_image.py).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

IGNORED = {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "MAINTAINER", "HEALTHCHECK", "STOPSIGNAL", "VOLUME", "SHELL"}
INSTALLERS = {"apt", "apt-get", "aptitude", "dpkg", "apk", "yum", "dnf", "microdnf", "zypper", "pacman", "pip", "pip3",
              "pipx", "uv", "uvx", "conda", "mamba", "npm", "npx", "yarn", "pnpm", "gem", "cargo", "go", "curl", "wget",
              "git-lfs", "sudo", "su", "useradd", "adduser", "groupadd", "chown"}
_ARCHIVE = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")
_SEPARATORS = re.compile(r"&&|\|\||[;|&\n()]")


@dataclass(frozen=True)
class Run:
    command: str


@dataclass(frozen=True)
class Files:
    files: dict[str, bytes]
    executable: tuple[str, ...] = ()


@dataclass
class BwrapPlan:
    """What the sandbox does before the agent starts, in order; `commands`: what the RUN steps call."""

    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    steps: list[Run | Files] = field(default_factory=list)
    commands: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)


class Unsupported(Exception):
    """A Dockerfile step a bubblewrap sandbox cannot honour (the message is the skip reason)."""


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) of each step: continuations joined, comments dropped."""
    steps, pending, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = whole.partition(" ")
        steps.append((start, keyword.upper(), rest.strip()))
    if pending:
        keyword, _, rest = pending.strip().partition(" ")
        steps.append((start, keyword.upper(), rest.strip()))
    return steps


def bwrap_plan(dockerfile: str, context: dict[str, bytes], executable: tuple[str, ...], workdir: str) -> BwrapPlan:
    """The steps of `dockerfile` for a sandbox whose work dir is `workdir`; Unsupported naming the step."""
    plan = BwrapPlan()
    froms = 0
    for number, keyword, rest in instructions(dockerfile):
        where = f"environment/Dockerfile line {number} ({keyword} {rest[:60]})"
        if "<<" in rest and keyword in ("RUN", "COPY", "ADD"):
            raise Unsupported(f"{where}: heredocs are not honoured on bubblewrap; use the docker backend")
        if keyword == "FROM":
            froms += 1
            if froms > 1:
                raise Unsupported(f"{where}: a multi-stage build needs docker; use the docker backend")
            plan.notes.append(f"FROM {rest.split()[0] if rest else '?'} ignored: bubblewrap runs on the host's /usr")
        elif keyword == "WORKDIR":
            plan.workdir = str(PurePosixPath(plan.workdir) / _expand(rest.strip('"'), plan.env))
        elif keyword in ("ENV", "ARG"):
            _variables(keyword, rest, plan.env, where)
        elif keyword in ("COPY", "ADD"):
            plan.steps.append(_copy(keyword, rest, plan, context, executable, workdir, where))
        elif keyword == "RUN":
            if plan.workdir != workdir:
                plan.notes.append(f"line {number}: RUN under WORKDIR {plan.workdir} runs in the work dir {workdir}")
            command = _shell_form(rest, where)
            plan.commands |= _commands(command, where)
            plan.steps.append(Run(command))
        elif keyword not in IGNORED:
            raise Unsupported(f"{where}: {keyword} is not honoured on bubblewrap; use the docker backend")
    return plan


def _variables(keyword: str, rest: str, env: dict[str, str], where: str) -> None:
    if keyword == "ARG":
        name, _, default = rest.partition("=")
        if default and name.strip() not in env:
            env[name.strip()] = _expand(_unquote(default), env)
        return
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise Unsupported(f"{where}: cannot parse ENV: {exc}") from None
    if words and "=" not in words[0]:  # the old form: ENV NAME value with spaces
        env[words[0]] = _expand(rest.split(None, 1)[1] if len(words) > 1 else "", env)
        return
    for word in words:
        name, _, value = word.partition("=")
        env[name] = _expand(value, env)


def _copy(keyword: str, rest: str, plan: BwrapPlan, context: dict[str, bytes], executable: tuple[str, ...],
          workdir: str, where: str) -> Files:
    words = _arguments(rest, where)
    flags = [word for word in words if word.startswith("--")]
    if any(flag.startswith(("--from", "--link", "--parents", "--exclude")) for flag in flags):
        raise Unsupported(f"{where}: {keyword} {' '.join(flags)} needs docker; use the docker backend")
    paths = [_expand(word, plan.env) for word in words if not word.startswith("--")]
    if len(paths) < 2:
        raise Unsupported(f"{where}: {keyword} needs a source and a destination")
    *sources, target = paths
    destination = PurePosixPath(plan.workdir) / target
    under = _relative_to(destination, workdir)
    if under is None:
        raise Unsupported(f"{where}: copies to {destination}, outside the work dir {workdir}; a bubblewrap sandbox "
                          "sees the host's read-only system folders: use the docker backend")
    into_folder = target.endswith("/") or len(sources) > 1 or target in (".", "./")
    files: dict[str, bytes] = {}
    runnable = []
    for source in sources:
        if keyword == "ADD" and (re.match(r"^\w+://", source) or source.endswith(_ARCHIVE)):
            raise Unsupported(f"{where}: ADD of a URL or an archive needs docker (and for a URL, a network)")
        name = str(PurePosixPath(source.lstrip("/"))).removeprefix("./").rstrip("/") if source not in (".", "./") else ""
        if name in context:
            matched = {name: PurePosixPath(name).name}
            single = True
        else:
            prefix = f"{name}/" if name else ""
            matched = {path: path[len(prefix):] for path in context if path.startswith(prefix)}
            single = False
        if not matched:
            raise Unsupported(f"{where}: {source} is not in the build context (environment/)")
        for path, relative in matched.items():
            placed = (under / relative) if (into_folder or not single) else under
            files[placed.as_posix()] = context[path]
            if path in executable:
                runnable.append(placed.as_posix())
    return Files(files, tuple(runnable))


def _relative_to(path: PurePosixPath, workdir: str) -> PurePosixPath | None:
    try:
        return path.relative_to(workdir)
    except ValueError:
        return None


def _shell_form(rest: str, where: str) -> str:
    if rest.startswith("["):
        try:
            return shlex.join(json.loads(rest))
        except (ValueError, TypeError) as exc:
            raise Unsupported(f"{where}: cannot parse its JSON form: {exc}") from None
    return rest


def _commands(command: str, where: str) -> set[str]:
    """The command names a RUN line calls (the first word of each part); Unsupported for an installer."""
    found = set()
    for part in _SEPARATORS.split(command):
        words = [word for word in part.split() if "=" not in word or word.startswith(("-", "/"))]
        if not words or words[0] in ("!", "{", "}", "then", "do", "else", "fi", "done", "if", "for", "while"):
            continue
        name = words[0].rsplit("/", 1)[-1]
        if name in INSTALLERS:
            raise Unsupported(f"{where}: `{name}` installs or downloads, which needs a network and a writable /usr; "
                              "use the docker backend with a local base image that has it installed")
        if re.fullmatch(r"[\w.+-]+", name):
            found.add(name)
    return found


def _arguments(rest: str, where: str) -> list[str]:
    if rest.startswith("["):
        try:
            return [str(word) for word in json.loads(rest)]
        except ValueError as exc:
            raise Unsupported(f"{where}: cannot parse its JSON form: {exc}") from None
    return rest.split()


def _expand(text: str, env: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda match: env.get(match.group(1) or match.group(3), match.group(2) or ""), text)


def _unquote(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" else text
