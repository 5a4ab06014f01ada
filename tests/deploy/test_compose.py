"""deploy/compose.yml, the team stack: a compose validator accepts it (and rejects a broken
copy), and the fixes of issue 13 are in place, read from the YAML itself: Prefect and MLflow
on separate databases made by the init script, the buckets made before MLflow and the worker
start, MLflow's artifacts in the MinIO bucket that is made, a worker that can run bubblewrap,
every dependency waiting for health or completion, every port on loopback; the image installs
rlpipe and its dependencies (dataset packages included) into a venv no sandbox can see.

The validator is Debian's `docker-compose` (1.29.2; `make system` installs it) or the docker
compose v2 plugin, whichever is installed; without either that one test skips and says so.
Nothing here pulls an image or starts a container.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose.yml"
WAITING_CONDITIONS = {"service_healthy", "service_completed_successfully"}
BWRAP_SECURITY_OPTIONS = {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}


def _with_defaults(text: str) -> str:
    """Compose's interpolation with nothing set: ${NAME:-default} -> default, $$ -> $."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text).replace("$$", "$")


def _services(text: str | None = None) -> dict:
    return yaml.safe_load(_with_defaults(text if text is not None else COMPOSE.read_text()))["services"]


def _option(command: str, name: str) -> str:
    words = shlex.split(command)
    return words[words.index(name) + 1]


def _validator() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    return None


def _config(validator: list[str], compose_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*validator, "-f", str(compose_file), "config", "-q"], capture_output=True, text=True, timeout=60)


def test_docker_compose_config_accepts_the_stack_and_rejects_a_broken_copy(tmp_path: Path) -> None:
    validator = _validator()
    if validator is None:
        pytest.skip("no compose validator: neither docker-compose nor `docker compose` is installed (`make system` installs "
                    "Debian's docker-compose)")
    accepted = _config(validator, COMPOSE)
    assert accepted.returncode == 0, accepted.stderr
    # The same file with one misspelt condition: the validator must refuse it (it validates).
    broken = tmp_path / "deploy" / "compose.yml"
    broken.parent.mkdir()
    broken.write_text(COMPOSE.read_text().replace("service_completed_successfully", "service_completed_sucessfully", 1))
    refused = _config(validator, broken)
    assert refused.returncode != 0 and "sucessfully" in refused.stdout + refused.stderr


def test_prefect_and_mlflow_have_separate_databases_made_by_the_init_script() -> None:
    services = _services()
    postgres = services["postgres"]
    mounts = [volume.split(":") for volume in postgres["volumes"] if "/docker-entrypoint-initdb.d/" in volume]
    assert len(mounts) == 1
    script = (DEPLOY / mounts[0][0]).resolve()
    assert script.parent == DEPLOY and script.suffix == ".sql"
    created = set(re.findall(r"^CREATE DATABASE (\w+);", script.read_text(), re.MULTILINE))
    prefect_url = urlsplit(services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"])
    mlflow_url = urlsplit(_option(services["mlflow"]["command"], "--backend-store-uri"))
    databases = {prefect_url.path.lstrip("/"), mlflow_url.path.lstrip("/")}
    assert len(databases) == 2 and databases <= created  # two, both made by the script
    assert prefect_url.hostname == mlflow_url.hostname == "postgres"
    # healthy only once the real server answers over TCP in a database the script made
    check = " ".join(postgres["healthcheck"]["test"])
    assert "-h 127.0.0.1" in check and any(f"-d {name}" in check for name in databases)


def test_the_buckets_are_made_before_mlflow_and_the_worker_start() -> None:
    services = _services()
    buckets = services["buckets"]
    assert buckets["depends_on"]["minio"]["condition"] == "service_healthy"
    made = buckets["command"][0]
    for name, value in buckets["environment"].items():
        made = made.replace(f"${name}", str(value))
    made_buckets = set(re.findall(r"stack/([a-z0-9.-]+)", made.split("mc mb", 1)[1]))
    destination = urlsplit(_option(services["mlflow"]["command"], "--artifacts-destination"))
    assert destination.scheme == "s3" and destination.netloc in made_buckets
    assert "rlpipe" in made_buckets  # the lake's bucket (deploy/README.md: s3://rlpipe/lake)
    assert urlsplit(services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"]).hostname == "minio"
    for starts_after in ("mlflow", "worker"):
        assert services[starts_after]["depends_on"]["buckets"]["condition"] == "service_completed_successfully"


def test_the_worker_can_run_bubblewrap_sandboxes() -> None:
    worker = _services()["worker"]
    assert BWRAP_SECURITY_OPTIONS <= set(worker["security_opt"])
    assert "privileged" not in worker and "cap_add" not in worker  # no more than bwrap needs
    assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"apt-get install [^\n]*\bbubblewrap\b", dockerfile)
    assert worker["shm_size"]  # weight sync goes through /dev/shm (docker's default: 64 MB)


def test_every_dependency_waits_and_every_port_is_on_loopback() -> None:
    services = _services()
    for name, service in services.items():
        for needed, how in service.get("depends_on", {}).items():
            assert how["condition"] in WAITING_CONDITIONS, (name, needed)
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[needed], needed
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def test_the_image_copies_only_files_of_this_repository() -> None:
    repository = DEPLOY.parent
    copied = re.findall(r"^COPY (.+) \S+$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    sources = [source for line in copied for source in line.split()]
    assert sources and all((repository / source).exists() for source in sources), sources


def test_rlpipe_and_its_dependencies_go_where_no_sandbox_looks() -> None:
    """Every pip install of the image runs with the venv first on the PATH, and the venv and
    rlpipe's source are outside every tree bubblewrap binds (issue 31, item 4)."""
    from rlpipe.sandbox.bwrap_mounts import ETC_HOST_PATHS

    dockerfile = (DEPLOY / "Dockerfile").read_text()
    venv = re.search(r"^ENV VIRTUAL_ENV=(\S+)$", dockerfile, re.MULTILINE).group(1)
    path_line = re.search(r"^ENV PATH=(\S+)$", dockerfile, re.MULTILINE)
    assert path_line.group(1).startswith(f"{venv}/bin:")
    made = dockerfile.index('RUN python -m venv "${VIRTUAL_ENV}"')
    installs = [m.start() for m in re.finditer(r"\bpip install\b", dockerfile)]
    assert installs and all(at > max(made, path_line.start()) for at in installs)
    source = re.search(r"^WORKDIR (\S+)$", dockerfile, re.MULTILINE).group(1)
    bound = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", *(f"/etc/{n}" for n in ETC_HOST_PATHS)]
    for private in (venv, source):
        assert not any(Path(private).is_relative_to(tree) for tree in bound), private
