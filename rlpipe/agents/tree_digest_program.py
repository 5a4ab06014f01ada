"""The digest of /work that agents/tree_state.py's `tree_digest` runs inside a sandbox
(its text, read as package data, is run as `python3 -I -S -c TEXT`): sha256 over every path
under /work (sorted), its type, its permission bits, a file's bytes and a link's target;
printed as hex. Stdlib only (rlpipe is not installed in a sandbox).

A real module so that it is read, linted and diffed as code; importing it runs nothing. What
it does not: compare digests (agents/replay.py does).
"""

import hashlib
import os
import stat


def main() -> None:
    digest = hashlib.sha256()
    for top, dirs, files in os.walk("/work"):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(top, name)
            info = os.lstat(path)
            digest.update(f"{os.path.relpath(path, '/work')}\0{stat.S_IFMT(info.st_mode)}\0{stat.S_IMODE(info.st_mode)}\0"
                          .encode("utf-8", "surrogateescape"))  # a name in bytes that are not UTF-8 is still a name
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode("utf-8", "surrogateescape"))
            elif stat.S_ISREG(info.st_mode):
                try:
                    with open(path, "rb") as handle:
                        for block in iter(lambda: handle.read(1 << 20), b""):
                            digest.update(block)
                except OSError as exc:
                    digest.update(f"unreadable {exc.errno}".encode())
            digest.update(b"\n")
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
    print(digest.hexdigest())


if __name__ == "__main__":
    main()
