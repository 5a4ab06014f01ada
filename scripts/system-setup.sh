#!/usr/bin/env bash
# System packages and services the tests need: bubblewrap, a docker engine, and Debian's
# docker-compose (1.29.2), whose `config` validates deploy/compose.yml (tests/deploy/test_compose.py;
# about 10 s to install on a lightly loaded 2-core machine, 40 s at a load of 8).
# Idempotent; installs only what is missing. Needs root (or sudo) to install; without it,
# prints what is missing and the tests that need it skip with a reason.
# `--no-image`: everything but the sandbox image, which needs the venv (.ci/run installs the
# packages and starts the engine while the venv installs, then builds the image).
set -uo pipefail
no_image=
[ "${1:-}" = --no-image ] && no_image=1
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v dockerd >/dev/null || missing+=(docker.io)
if [ ${#missing[@]} -gt 0 ]; then
  echo "system-setup: installing ${missing[*]}"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || echo "system-setup: could not install ${missing[*]}; the tests that need them will skip"
fi
# On its own: a distribution without the package must not cost the others.
if ! command -v docker-compose >/dev/null; then
  echo "system-setup: installing docker-compose"
  { [ ${#missing[@]} -gt 0 ] || as_root apt-get update -qq; } \
    && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null \
    || echo "system-setup: could not install docker-compose; the compose validation test will skip"
fi

if [ -f .ci/docker-setup.sh ]; then
  NO_IMAGE=$no_image bash .ci/docker-setup.sh || echo "system-setup: docker engine not available; docker tests will skip"
fi
exit 0
