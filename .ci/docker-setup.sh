#!/usr/bin/env bash
# Make a docker engine answer on this machine and build rlpipe's sandbox image from local files.
#
# For CI on a fresh Debian machine where we are root: installs docker.io if it is missing,
# starts dockerd in the background (log: ${DOCKERD_LOG:-/tmp/dockerd.log}) unless an engine
# already answers, waits up to 60 s for `docker info`, then builds `rlpipe-sandbox:<hash>`
# (rlpipe/sandbox/image.py; no registry is contacted). Idempotent: run it again at no cost.
# PYTHON selects the interpreter that has rlpipe installed (default: .venv/bin/python);
# NO_IMAGE=1 stops before the image (no venv needed).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
DOCKERD_LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
export DEBIAN_FRONTEND=noninteractive

missing=()
command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1 || missing+=(docker.io)
ls /usr/bin/python3.[0-9]* >/dev/null 2>&1 || missing+=(python3-minimal)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    echo "starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd >"$DOCKERD_LOG" 2>&1 &
fi
for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
done
if ! docker info >/dev/null 2>&1; then
    echo "docker engine did not answer within 60 s; the end of $DOCKERD_LOG:" >&2
    tail -n 40 "$DOCKERD_LOG" >&2 || true
    exit 1
fi

[ -n "${NO_IMAGE:-}" ] && exit 0
"$PYTHON" -c 'from rlpipe.sandbox.docker_backend import docker_client
from rlpipe.sandbox.image import ensure_image
print("sandbox image:", ensure_image(docker_client()))'
