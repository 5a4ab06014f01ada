"""The state file of the local services that `rlpipe up` starts (Prefect server, MLflow UI).

What it does: reads and writes a small JSON file, $RLPIPE_HOME/services.json (default
~/.rlpipe/services.json), holding the Prefect API URL, the MLflow tracking URI and the
process ids; and says whether the recorded services are alive (a process still exists)
and whether a URL answers (its port accepts a TCP connection within a second).

What it does not: start or stop processes (the CLI's `up` / `down` do), or talk HTTP to the
services beyond opening a socket.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

STATE_FILE_NAME = "services.json"


@dataclass(frozen=True)
class LocalServices:
    """What `rlpipe up` started: the Prefect API URL, the MLflow URI and their process ids."""

    prefect_api_url: str
    mlflow_uri: str
    pids: tuple[int, ...]
    started_at_ms: int = 0

    @property
    def prefect_ui_url(self) -> str:
        """The Prefect UI: the API URL without its trailing /api."""
        return self.prefect_api_url.rstrip("/").removesuffix("/api")

    def to_json(self) -> str:
        return json.dumps(
            {
                "prefect_api_url": self.prefect_api_url,
                "mlflow_uri": self.mlflow_uri,
                "pids": list(self.pids),
                "started_at_ms": self.started_at_ms,
            },
            indent=2,
        )

    @staticmethod
    def from_json(text: str) -> LocalServices:
        d = json.loads(text)
        return LocalServices(
            prefect_api_url=str(d["prefect_api_url"]),
            mlflow_uri=str(d["mlflow_uri"]),
            pids=tuple(int(pid) for pid in d.get("pids", [])),
            started_at_ms=int(d.get("started_at_ms", 0)),
        )


def rlpipe_home(home: Path | None = None) -> Path:
    """`home` if given, else $RLPIPE_HOME, else ~/.rlpipe."""
    if home is not None:
        return Path(home)
    configured = os.environ.get("RLPIPE_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".rlpipe"


def services_file(home: Path | None = None) -> Path:
    return rlpipe_home(home) / STATE_FILE_NAME


def read_services(home: Path | None = None) -> LocalServices | None:
    """The recorded services, or None when there is no (readable) state file."""
    path = services_file(home)
    try:
        return LocalServices.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a torn or foreign file means: nothing known to be running


def write_services(services: LocalServices, home: Path | None = None) -> Path:
    """Write the state file atomically; return its path."""
    path = services_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    partial.write_text(services.to_json())
    os.replace(partial, path)
    return path


def clear_services(home: Path | None = None) -> None:
    services_file(home).unlink(missing_ok=True)


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this id exists (None -> False)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def url_answers(url: str | None, timeout_s: float = 1.0) -> bool:
    """Whether the host:port of an http(s) URL accepts a TCP connection."""
    if not url:
        return False
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def read_live_services(home: Path | None = None) -> LocalServices | None:
    """The recorded services if any of their processes still exists, else None (a record
    without pids counts as live when one of its URLs answers)."""
    services = read_services(home)
    if services is None:
        return None
    if services.pids:
        return services if any(pid_alive(pid) for pid in services.pids) else None
    alive = url_answers(services.mlflow_uri) or url_answers(services.prefect_api_url)
    return services if alive else None


def live_mlflow_uri(home: Path | None = None) -> str | None:
    """The MLflow URI of a running `rlpipe up` whose port answers, or None."""
    services = read_live_services(home)
    if services is None or not url_answers(services.mlflow_uri):
        return None
    return services.mlflow_uri


def live_prefect_api_url(home: Path | None = None) -> str | None:
    """The Prefect API URL of a running `rlpipe up` whose port answers, or None."""
    services = read_live_services(home)
    if services is None or not url_answers(services.prefect_api_url):
        return None
    return services.prefect_api_url
