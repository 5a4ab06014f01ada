"""A task's own docker image: its environment/Dockerfile built offline, and the /work link a sandbox needs.

`build_task_image(client, context)` builds a Harbor task's environment/ folder (the files
as loaded, sent as a tar: the build context) with the docker SDK, `pull=False` and no
network for its RUN steps, tagged `rlpipe-task:<digest of the context>`; an image already
there under that tag is not built again. Before building, every FROM base must be present
on the engine: one that is not (nothing can be pulled here) is a TaskImageUnavailable
naming it. The built image must hold /bin/sh and python3 >= 3.8 (rlpipe's in-container
programs run as `python3 -I -S`), else TaskImageUnavailable says so. What it returns:
the image's WORKDIR ("/" or none: /app), its ENV (applied by docker to every command), and
the regular files under the WORKDIR (the agent's initial files: the sandbox mounts its
tmpfs over the WORKDIR, so they are written into it; symlinks and empty folders there are
not carried).

`workspace_image(client, image, path)` gives an image whose /work is a symbolic link to
`path` (made with put_archive on a created container and committed, no RUN step): the
sandbox mounts its tmpfs at `path`, and rlpipe's programs, which work on /work, reach it.

What it does not: pull, push, or remove images (the tags stay for the next run; `docker
image prune` removes them), nor honour a Dockerfile's USER, CMD or ENTRYPOINT (the
sandbox's own user and init run).
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import threading
from dataclasses import dataclass

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import WORK

TASK_REPOSITORY = "rlpipe-task"
BUILDER_VERSION = "1"
MAX_WORKDIR_BYTES = 16 * 1024 * 1024  # the initial files of one task, at most (a task folder's own bound)
DEFAULT_WORKDIR = "/app"
_CHECK = "import sys; sys.exit(0 if sys.version_info >= (3, 8) else 3)"
_built: dict[str, TaskImage] = {}
_lock = threading.Lock()


class TaskImageUnavailable(Exception):
    """This task's image cannot be had here (a base that is not present, a failed build, no
    python3): the trial is skipped with this reason."""


@dataclass(frozen=True)
class TaskImage:
    tag: str
    workdir: str
    env: tuple[tuple[str, str], ...]
    files: dict[str, bytes]
    executable: tuple[str, ...]


def context_digest(files: dict[str, bytes], executable: tuple[str, ...]) -> str:
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    for path in sorted(files):
        digest.update(f"{path}\0{path in executable}\0{len(files[path])}\0".encode())
        digest.update(files[path])
    return digest.hexdigest()[:16]


def base_images(dockerfile: str) -> list[str]:
    """The images the Dockerfile's FROM lines name (not `scratch`, not an earlier stage)."""
    bases, stages = [], set()
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        words = [word for word in words[1:] if not word.startswith("--")]
        if not words:
            continue
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if words[0].lower() != "scratch" and words[0].lower() not in stages:
            bases.append(words[0])
    return bases


def build_task_image(client, files: dict[str, bytes], executable: tuple[str, ...]) -> TaskImage:
    """The task image of an environment/ folder (`files` holds its Dockerfile); see the module docstring."""
    tag = f"{TASK_REPOSITORY}:{context_digest(files, executable)}"
    import docker.errors

    with _lock:
        if tag not in _built:
            try:
                _built[tag] = _build(client, tag, files, executable)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailable(f"docker failed while it made the task image {tag}: {exc}",
                                         hint="check `docker info` and free disk space") from exc
        return _built[tag]


def _build(client, tag: str, files: dict[str, bytes], executable: tuple[str, ...]) -> TaskImage:
    import docker.errors

    source = f"{tag}-build"
    try:
        client.images.get(source)
    except docker.errors.ImageNotFound:
        for base in base_images(files["Dockerfile"].decode("utf-8", errors="replace")):
            if "$" in base:
                continue  # an ARG: docker build resolves it
            try:
                client.images.get(base)
            except docker.errors.ImageNotFound:
                raise TaskImageUnavailable(
                    f"base image {base} of environment/Dockerfile is not present on this docker engine and cannot "
                    f"be pulled (no registry access): load it (`docker load`) or tag a local image as {base}") from None
        try:
            client.images.build(fileobj=io.BytesIO(_context_tar(files, executable)), custom_context=True, tag=source,
                                pull=False, network_mode="none", rm=True, forcerm=True)
        except docker.errors.BuildError as exc:
            lines = [str(part.get("stream") or part.get("error") or "").strip() for part in exc.build_log]
            last = " | ".join(line for line in lines if line)[-400:]
            raise TaskImageUnavailable(f"docker build of environment/Dockerfile failed (offline, pull=False): {exc.msg}: "
                                       f"{last}") from None
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"docker could not build the task image {source}: {exc}", hint="check `docker info`") from exc
    config = client.images.get(source).attrs.get("Config") or {}
    workdir = (config.get("WorkingDir") or "").rstrip("/") or DEFAULT_WORKDIR
    env = tuple(tuple(item.split("=", 1)) for item in config.get("Env") or [] if "=" in item)
    _check_programs(client, source)
    found, runnable = _workdir_files(client, source, workdir)
    return TaskImage(workspace_image(client, source, workdir), workdir, env, found, runnable)


def _context_tar(files: dict[str, bytes], executable: tuple[str, ...]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(files):
            member = tarfile.TarInfo(path)
            member.size, member.mode = len(files[path]), 0o755 if path in executable else 0o644
            archive.addfile(member, io.BytesIO(files[path]))
    return buffer.getvalue()


def _check_programs(client, image: str) -> None:
    import docker.errors

    try:
        client.containers.run(image, entrypoint=["/bin/sh", "-c", 'exec python3 -I -S -c "$0"', _CHECK], user="65534:65534",
                              network_mode="none", remove=True, stdout=True, stderr=True)
    except docker.errors.ContainerError as exc:
        raise TaskImageUnavailable(f"the task's image lacks /bin/sh or python3 >= 3.8 (exit {exc.exit_status}), which "
                                   "rlpipe's in-container programs need: install python3 in environment/Dockerfile") from None
    except docker.errors.DockerException as exc:
        raise TaskImageUnavailable(f"the task's image cannot start /bin/sh and python3: {exc}") from None


def _workdir_files(client, image: str, workdir: str) -> tuple[dict[str, bytes], tuple[str, ...]]:
    """The regular files under `workdir` in `image` (relative paths) and those with an execute bit."""
    import docker.errors

    container = client.containers.create(image, entrypoint=["/bin/sh"])
    try:
        try:
            stream, _ = container.get_archive(workdir + "/.")
        except docker.errors.NotFound:
            return {}, ()
        archive = io.BytesIO(b"".join(stream))
    finally:
        container.remove(force=True)
    files, runnable, total = {}, [], 0
    with tarfile.open(fileobj=archive, mode="r:") as members:
        for member in members:
            relative = member.name.split("/", 1)[1] if "/" in member.name else ""
            if not member.isfile() or not relative:
                continue
            total += member.size
            if total > MAX_WORKDIR_BYTES:
                raise TaskImageUnavailable(f"the task image's {workdir} holds more than {MAX_WORKDIR_BYTES} bytes of "
                                           "files; rlpipe copies at most that into the work dir")
            files[relative] = members.extractfile(member).read()
            if member.mode & 0o111:
                runnable.append(relative)
    return files, tuple(runnable)


def workspace_image(client, image: str, path: str) -> str:
    """`image` with /work a link to `path` (and `path` a folder), tagged by both; cached on the engine."""
    import docker.errors

    if path == WORK:
        return image
    try:
        image_id = client.images.get(image).id
        tag = f"{TASK_REPOSITORY}:work-{hashlib.sha256(f'{image_id}{path}'.encode()).hexdigest()[:16]}"
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        container = client.containers.create(image, entrypoint=["/bin/sh"])
        try:
            container.put_archive("/", _link_tar(path))
            repository, version = tag.split(":")
            container.commit(repository=repository, tag=version)
        finally:
            container.remove(force=True)
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"docker could not make the work dir image of {image} at {path}: {exc}",
                                 hint="check `docker info`") from exc
    return tag


def _link_tar(path: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo(WORK.lstrip("/"))
        link.type, link.linkname = tarfile.SYMTYPE, path
        archive.addfile(link)
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            folder = tarfile.TarInfo("/".join(parts[:depth]))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(folder)
    return buffer.getvalue()
