#!/usr/bin/env bash
# Install requirements.lock (every package pinned) into a venv with uv, from the same package
# sources pip is configured with, then byte-compile what it installed.
#
# Why uv: the lock holds ~220 packages (torch among them). pip unpacks and byte-compiles them
# one by one on one core; uv does both in parallel. Measured one after the other on a 2-core
# machine with other jobs running (so the wall times are rough): pip 4 min 45 s (203 s of
# CPU), uv 1 min 18 s (140 s of CPU) for the same lock; CI prints the set-up time of each run. Byte-compiling at
# install matters on machines that set PYTHONDONTWRITEBYTECODE (nothing compiled later is ever
# cached there, so every test process would compile torch from source again).
#
# pip's sources (find-links, index-url, extra-index-url from pip.conf or PIP_* variables) are
# read with `pip config list` and handed to uv, which reads no pip configuration. Where uv
# cannot be installed (no package index reachable for it), pip installs the lock as before.
#
# usage: scripts/install-locked.sh VENV LOCKFILE
set -euo pipefail
venv=$1
lock=$2
UV_VERSION=0.13.9

if ! "$venv/bin/pip" install -q "uv==$UV_VERSION"; then
  echo "install-locked: uv $UV_VERSION not installable here; installing $lock with pip" >&2
  exec "$venv/bin/pip" install -q -r "$lock"
fi

mapfile -t sources < <("$venv/bin/python" - <<'EOF'
import ast, subprocess, sys
flags = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url"}
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
for line in listed.splitlines():
    key, _, value = line.partition("=")
    option = key.rsplit(".", 1)[-1]
    if option in flags and value:
        for source in ast.literal_eval(value).split():
            print(flags[option])
            print(source)
EOF
)

# unsafe-best-match: the pinned version may sit on any configured source (a local index can
# hold some packages at other versions), as pip looks across all of them
"$venv/bin/uv" pip install --quiet --python "$venv/bin/python" \
  --compile-bytecode --index-strategy unsafe-best-match "${sources[@]}" -r "$lock"
