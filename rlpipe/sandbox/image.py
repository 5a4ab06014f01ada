"""Build the docker sandbox image from files of this host (no registry is ever contacted).

The image is a minimal root filesystem assembled from host files: the distribution's
python3.N interpreter (the newest /usr/bin/python3.N with /usr/lib/python3.N; 3.11 on
Debian 12) and its standard library (without tests, tkinter, idle, ensurepip), `dash` as
/bin/sh, the shell tools agent tasks use (TOOL_PACKAGES: bash, coreutils, grep, sed, awk,
find, diff, git, jq, make, gcc with binutils and the C library headers), copied from the
file lists dpkg keeps for those host packages (docs, man pages and locales left out; a
package the host lacks is left out too, and its commands are then missing, which agent
tasks report as skipped), the shared libraries all of these link against (found with
`ldd`), an /etc/passwd with a non-root `sandbox` user (uid 1000), and empty mount points
/work and /tmp. Set-uid bits are dropped. The tar stream
is built in memory, entries sorted, mtimes and owners zeroed, so the same host files always
give the same image; it is loaded with `docker import`.

The tag is `rlpipe-sandbox:<hash>`, the hash taken over the builder version and the path,
size, mode and mtime of every source file, so `ensure_image` costs a few hundred `stat`s
and one `docker inspect` when the image already exists, and a host upgrade of python
builds a new image. Within one process the answer is cached per client.

What it does not do: it ships no package manager, no network tools and no site-packages;
Python code in the sandbox gets the standard library and nothing else.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path

from rlpipe.core.errors import SandboxUnavailable

IMAGE_REPOSITORY = "rlpipe-sandbox"
BUILDER_VERSION = "2"
SANDBOX_UID = 1000
SHELL_BINARY = Path("/usr/bin/dash")
DPKG_INFO = Path("/var/lib/dpkg/info")
TOOL_PACKAGES = ("bash", "coreutils", "grep", "sed", "mawk", "findutils", "diffutils", "git", "jq", "libjq1", "libonig5",
                 "make", "gcc", "gcc-12", "cpp", "cpp-12", "binutils", "binutils-common", "binutils-x86-64-linux-gnu",
                 "libbinutils", "libc6-dev", "libgcc-12-dev", "libgcc-s1", "linux-libc-dev", "libcrypt-dev")
TOOL_LINKS = {"/usr/bin/awk": "mawk", "/usr/bin/cc": "gcc"}  # what Debian's alternatives point at
_PACKAGE_SKIP = ("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale", "/usr/share/lintian",
                 "/usr/share/bash-completion", "/usr/share/perl5", "/usr/share/gitweb", "/usr/share/gitk", "/usr/share/git-gui",
                 "/usr/share/bug", "/usr/share/menu")
_PACKAGE_SKIP_NAMES = ("lto1", "lto-dump-12", "x86_64-linux-gnu-lto-dump-12", "x86_64-linux-gnu-ld.gold",
                       "x86_64-linux-gnu-gprofng", "libgprofng.so.0.0.0")
_STATIC_KEEP = ("libc_nonshared.a", "libgcc.a", "libgcc_eh.a", "libpthread.a", "libdl.a", "librt.a")  # other .a: static
# linking and sanitizers, left out (tens of MB)
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages",
               "dist-packages", "lib2to3", "EXTERNALLY-MANAGED"}


def _system_python() -> tuple[Path, Path]:
    """The newest distribution interpreter /usr/bin/python3.N that has its stdlib in /usr/lib/python3.N."""
    found = []
    for binary in Path("/usr/bin").glob("python3.*"):
        minor = binary.name.removeprefix("python3.")
        if minor.isdigit() and (Path("/usr/lib") / binary.name / "os.py").exists():
            found.append((int(minor), binary, Path("/usr/lib") / binary.name))
    if not found:
        return Path("/usr/bin/python3.11"), Path("/usr/lib/python3.11")  # missing: image_entries says so
    _, binary, stdlib = max(found)
    return binary, stdlib


PYTHON_BINARY, STDLIB_DIR = _system_python()

_PASSWD = b"root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/work:/bin/sh\n"
_GROUP = b"root:x:0:\nsandbox:x:1000:\n"


@dataclass(frozen=True)
class _Entry:
    """One member of the image tar: a host file copied to `arcname`, or a symlink/dir."""

    arcname: str
    source: Path | None = None
    link_target: str | None = None
    mode: int = 0o755
    data: bytes | None = None


def _shared_libraries(*binaries: Path) -> list[Path]:
    """The absolute paths `ldd` resolves for `binaries` (what it cannot read adds nothing)."""
    output = ""
    for start in range(0, len(binaries), 200):
        try:
            output += subprocess.run(["ldd", *map(str, binaries[start:start + 200])], capture_output=True, text=True,
                                     timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    libraries = []
    for line in output.splitlines():
        if not line.startswith(("\t", " ")):
            continue  # "path:" headers of several files
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libraries.append(Path(parts[2]))
        elif parts and parts[0].startswith("/"):
            libraries.append(Path(parts[0]))  # the dynamic loader itself
    return libraries


def _stdlib_entries() -> list[_Entry]:
    entries = []
    for root, dirs, files in os.walk(STDLIB_DIR):
        relative = Path(root).relative_to(STDLIB_DIR)
        dirs[:] = sorted(d for d in dirs if not (relative == Path(".") and (d in STDLIB_SKIP or d.startswith("config-"))))
        for name in sorted(files):
            if relative == Path(".") and (name in STDLIB_SKIP or name.startswith("config-")):
                continue
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            entries.append(_Entry(arcname=str(path), source=path, mode=path.stat().st_mode & 0o777))
    return entries


def _package_paths(package: str) -> list[Path]:
    """The paths dpkg lists for an installed host package (empty when it is not installed)."""
    for name in (f"{package}.list", f"{package}:amd64.list", f"{package}:arm64.list"):
        listing = DPKG_INFO / name
        if listing.is_file():
            return [Path(line) for line in listing.read_text(errors="replace").splitlines() if line.startswith("/")]
    return []


def _tool_entries() -> tuple[list[_Entry], list[Path]]:
    """The files and links of TOOL_PACKAGES, and the ELF candidates among them (for ldd)."""
    entries, binaries = [], []
    for package in TOOL_PACKAGES:
        for path in _package_paths(package):
            text = str(path)
            if text.startswith(_PACKAGE_SKIP) or path.name in _PACKAGE_SKIP_NAMES or (
                    path.suffix == ".a" and path.name not in _STATIC_KEEP):
                continue
            if path.is_symlink():
                target = os.readlink(path)
                if target.startswith("/etc/alternatives/"):
                    target = str(path.resolve())
                entries.append(_Entry(arcname=text, link_target=target))
            elif path.is_file():
                mode = path.stat().st_mode & 0o755
                entries.append(_Entry(arcname=text, source=path, mode=mode))
                if mode & 0o111 or ".so" in path.name:
                    binaries.append(path)
    for link, target in TOOL_LINKS.items():
        if (Path(link).parent / target).exists():
            entries.append(_Entry(arcname=link, link_target=target))
    return entries, binaries


def image_entries() -> list[_Entry]:
    """Every member of the image, sorted by path (a pure function of the host files)."""
    if not PYTHON_BINARY.exists() or not STDLIB_DIR.is_dir():
        raise SandboxUnavailable(
            f"cannot build the docker sandbox image: {PYTHON_BINARY} or {STDLIB_DIR} is missing",
            hint="install the distribution's interpreter: apt-get install -y python3-minimal",
        )
    tools, tool_binaries = _tool_entries()
    binaries = [PYTHON_BINARY, SHELL_BINARY, *tool_binaries]
    binaries += sorted((STDLIB_DIR / "lib-dynload").glob("*.so"))
    libraries = sorted(set(_shared_libraries(*binaries)))
    entries = [
        _Entry(arcname=str(PYTHON_BINARY), source=PYTHON_BINARY),
        _Entry(arcname="/usr/bin/python3", link_target=PYTHON_BINARY.name),
        _Entry(arcname="/usr/bin/python", link_target=PYTHON_BINARY.name),
        _Entry(arcname=str(SHELL_BINARY), source=SHELL_BINARY),
        _Entry(arcname="/bin/sh", link_target="/usr/bin/dash"),
        _Entry(arcname="/etc/passwd", data=_PASSWD, mode=0o644),
        _Entry(arcname="/etc/group", data=_GROUP, mode=0o644),
    ]
    entries += tools
    entries += [_Entry(arcname=str(lib), source=lib.resolve()) for lib in libraries]
    entries += _stdlib_entries()
    directories = {"/work": 0o755, "/tmp": 0o1777, "/proc": 0o555, "/sys": 0o555, "/dev": 0o755,
                   "/root": 0o700}
    entries += [_Entry(arcname=path, mode=mode) for path, mode in directories.items()]
    unique = {entry.arcname: entry for entry in entries}
    # a link that is also a folder of other entries (/bin -> usr/bin on a merged-/usr host) stays a folder
    folders = {str(parent) for name in unique for parent in Path(name).parents}
    return [unique[name] for name in sorted(unique) if not (unique[name].link_target is not None and name in folders)]


def image_tag(entries: list[_Entry]) -> str:
    """`rlpipe-sandbox:<hash>` over the builder version and each source's path, size, mode, mtime."""
    digest = hashlib.sha256(BUILDER_VERSION.encode())
    for entry in entries:
        digest.update(f"{entry.arcname}\0{entry.link_target}\0{entry.mode}\0".encode())
        if entry.source is not None:
            stat = entry.source.stat()
            digest.update(f"{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        if entry.data is not None:
            digest.update(entry.data)
    return f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:16]}"


def build_rootfs_tar(entries: list[_Entry]) -> bytes:
    """The root filesystem as a deterministic tar stream (parents created as needed)."""
    buffer = io.BytesIO()
    written_dirs: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for entry in entries:
            parts = entry.arcname.strip("/").split("/")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent not in written_dirs:
                    written_dirs.add(parent)
                    archive.addfile(_member(parent, tarfile.DIRTYPE, 0o755))
            name = "/".join(parts)
            if entry.link_target is not None:
                member = _member(name, tarfile.SYMTYPE, 0o777)
                member.linkname = entry.link_target
                archive.addfile(member)
            elif entry.source is None and entry.data is None:
                written_dirs.add(name)
                archive.addfile(_member(name, tarfile.DIRTYPE, entry.mode))
            else:
                data = entry.data if entry.data is not None else entry.source.read_bytes()
                member = _member(name, tarfile.REGTYPE, entry.mode)
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _member(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.mode = mode
    member.mtime = 0
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member


_ensured: dict[int, str] = {}
_ensure_lock = threading.Lock()


def ensure_image(client) -> str:  # client: docker.DockerClient
    """The tag of the sandbox image, importing it from host files if the engine lacks it."""
    with _ensure_lock:
        if id(client) not in _ensured:
            _ensured[id(client)] = _ensure_image(client)
        return _ensured[id(client)]


def _ensure_image(client) -> str:
    import docker.errors

    entries = image_entries()
    tag = image_tag(entries)
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"docker engine failed to look up image {tag}: {exc}",
                                 hint="check `docker info`; start the engine with `dockerd &`") from exc
    repository, version = tag.split(":")
    try:
        client.api.import_image_from_data(
            build_rootfs_tar(entries), repository=repository, tag=version,
            changes=[f"USER {SANDBOX_UID}:{SANDBOX_UID}", "WORKDIR /work", "ENV PATH=/usr/bin:/bin",
                     "LABEL rlpipe.sandbox.image=1"],
        )
        client.images.get(tag)
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"docker engine failed to import the sandbox image {tag}: {exc}",
                                 hint="check free disk space and `docker info`") from exc
    return tag
