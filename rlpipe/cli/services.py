"""`rlpipe up` / `rlpipe down`: a local Prefect server and MLflow UI on 127.0.0.1, and a
runner that serves rlpipe's deployments (flows/serve.py: `rl-train/train` with a form of
the run config, `rl-eval/eval`), so a run starts from the UI without writing JSON.

`up` refuses ports that another process listens on (exit 2, naming the port), starts the
servers as background processes (their own session, logs under $RLPIPE_HOME), waits until
they answer while still alive (a server that exits, e.g. because another took its port
meanwhile, is an error, never "up"), then starts the runner and waits until its deployments
exist, and records their URLs and pids in the services file
(storage/local_services.py). From then on `rlpipe train` reports to them without flags;
after `down` (or when they died) the embedded defaults serve again: Prefect's ephemeral
mode and MLflow in ./mlruns.db.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import typer

from rlpipe.cli.consoles import stdout_console
from rlpipe.core.errors import InfraError, UserError
from rlpipe.storage.local_services import (
    LocalServices,
    clear_services,
    live_prefect_api_url,
    read_live_services,
    rlpipe_home,
    write_services,
)

console = stdout_console()
STARTUP_TIMEOUT_S = float(os.environ.get("RLPIPE_SERVICE_STARTUP_TIMEOUT_S", "300"))
"""How long `up` waits for each server and each deployment to answer: a hang guard. A first
start migrates a new Prefect database (~18 s of CPU), which took over 90 s of wall time on a
2-core machine at load average 12 (the old bound: `up` failed there)."""
SERVED_DEPLOYMENTS = ("rl-train/train", "rl-eval/eval", "rl-qa/qa", "rl-rescore/rescore")
"""What `python -m rlpipe.flows.serve` registers (flows/serve.py; the CLI does not import Prefect)."""
MLFLOW_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""The MLflow UI of `up` runs one uvicorn worker and no job runner (MLflow's GenAI jobs,
unused here): with MLflow's defaults (4 workers, a huey job runner and its consumers) its
server is 15 processes and several GB resident on a small machine (docs/RESULTS.md,
"`rlpipe up`'s MLflow UI")."""


def up(
    prefect_port: int = typer.Option(4200, help="Port of the Prefect server on 127.0.0.1."),
    mlflow_port: int = typer.Option(5000, help="Port of the MLflow server on 127.0.0.1."),
) -> None:
    """Start a local Prefect server and MLflow UI on loopback; print their URLs."""
    running = read_live_services()
    if running is not None:
        console.print(f"already up: Prefect {running.prefect_ui_url}  MLflow {running.mlflow_uri}")
        return
    _check_ports_free({"--prefect-port": prefect_port, "--mlflow-port": mlflow_port})
    home = rlpipe_home()
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    prefect_api = f"http://127.0.0.1:{prefect_port}/api"
    console.print(f"starting the Prefect server (port {prefect_port}) and the MLflow UI (port {mlflow_port}); "
                  f"a first start makes their databases, a minute or two on 2 cores (logs in {logs})")
    mlflow_uri = f"http://127.0.0.1:{mlflow_port}"
    prefect = _spawn(
        [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
        # the UI asks /ui-settings where its API is: this server's port, not Prefect's default 4200
        # (nor a PREFECT_API_URL of the user's that names another server)
        logs / "prefect.log", {"PREFECT_HOME": str(home / "prefect"), "PREFECT_UI_API_URL": prefect_api,
                               "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(prefect_port)},
    )
    mlflow = _spawn(
        [str(bin_dir / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination", str(home / "mlartifacts")],
        logs / "mlflow.log", MLFLOW_ENV,
    )
    started = [prefect, mlflow]
    try:
        _wait_for(f"{prefect_api}/health", "Prefect server", logs / "prefect.log", prefect)
        console.print("Prefect server answers")
        _wait_for(f"{mlflow_uri}/health", "MLflow server", logs / "mlflow.log", mlflow)
        console.print("MLflow UI answers; serving the deployments")
        for process, what, log in ((prefect, "Prefect server", "prefect.log"), (mlflow, "MLflow server", "mlflow.log")):
            _check_alive(process, what, logs / log)  # the one that answered was ours
        # The deployments' runner, once the server answers (flows/serve.py): it reports to
        # up's MLflow through the services file, which is written before it runs a flow.
        runner = _spawn([sys.executable, "-m", "rlpipe.flows.serve"], logs / "deployments.log",
                        {"PREFECT_HOME": str(home / "prefect"), "PREFECT_API_URL": prefect_api})
        started.append(runner)
        for deployment in SERVED_DEPLOYMENTS:
            _wait_for(f"{prefect_api}/deployments/name/{deployment}", f"deployment {deployment}", logs / "deployments.log", runner)
    except InfraError:
        _stop(tuple(process.pid for process in started))
        raise
    services = LocalServices(prefect_api_url=prefect_api, mlflow_uri=mlflow_uri, pids=tuple(process.pid for process in started))
    write_services(services)
    console.print(f"Prefect UI  {services.prefect_ui_url}")
    console.print(f"MLflow UI   {mlflow_uri}")
    console.print(f"deployments {', '.join(SERVED_DEPLOYMENTS)} (start a run from the UI: Deployments -> rl-train/train -> Run)")
    console.print(f"logs in {logs}; `rlpipe train` now reports to these; stop with `rlpipe down`")


def down() -> None:
    """Stop what `rlpipe up` started. Each was started in a session of its own, so a signal
    to its process group reaches its children too: the runner's flow runs and their workers."""
    services = read_live_services()
    if services is None:
        clear_services()
        console.print("nothing running")
        return
    _stop(services.pids)
    clear_services()
    console.print("stopped the local Prefect server, MLflow UI and deployments' runner (with its flow runs)")


def export_service_env(verbose: bool) -> None:
    """Point Prefect at `rlpipe up`'s server when one is alive (unless PREFECT_API_URL is set
    already), and keep its console quiet unless verbose. Prefect reads these variables when it
    is imported, which the CLI does after this; where it was imported before (rlpipe used as a
    library, the tests' pre-imported CLI), its settings and logging are read again."""
    prefect_api_url = live_prefect_api_url()
    if prefect_api_url is not None and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_API_URL"] = prefect_api_url
    if not verbose:
        for handler in ("CONSOLE", "CONSOLE_FLOW_RUNS", "CONSOLE_TASK_RUNS"):
            os.environ.setdefault(f"PREFECT_LOGGING_HANDLERS_{handler}_LEVEL", "CRITICAL")
    if "prefect.context" in sys.modules:
        from rlpipe.orchestration.prefect_server import reread_prefect_settings

        reread_prefect_settings()


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env}, start_new_session=True)


def _check_ports_free(ports: dict[str, int]) -> None:
    """UserError naming the first port (by its option) that is taken on 127.0.0.1, or used twice."""
    if len(set(ports.values())) < len(ports):
        raise UserError(f"{' and '.join(ports)} are the same port ({next(iter(ports.values()))})", "give each service its own port")
    for option, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no obstacle
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                raise UserError(
                    f"port {port} on 127.0.0.1 is taken ({exc.strerror}): another process listens there",
                    f"stop it (`ss -ltnp 'sport = :{port}'` names it) or pass another {option}",
                ) from None


def _check_alive(process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    code = process.poll()
    if code is not None:
        raise InfraError(f"{what} exited with code {code} while starting (its port taken by another process?)",
                         f"see its log: {log}")


def _wait_for(url: str, what: str, log: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        _check_alive(process, what, log)
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise InfraError(f"{what} did not answer at {url} within {STARTUP_TIMEOUT_S:.0f} s", f"see its log: {log}")


def _stop(pids: tuple[int, ...]) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
