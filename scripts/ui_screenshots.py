"""Take the screenshots of docs/OPERATIONS.md ("Starting runs from the UI") from a live
`rlpipe up`: the train deployment's run form, a flow run's Logs tab with its progress lines,
and the MLflow page of that run. Run by hand (not by CI), from the repository root:

    apt-get install -y chromium        # Debian's headless Chromium (or pass --chromium PATH)
    .venv/bin/python scripts/ui_screenshots.py [--out docs/images] [--keep] [--chromium PATH]

It needs nothing beyond the project's venv (websockets and pillow are in requirements.lock).

What it does, each step failing with one line (exit 1) that says which step and where its
logs are:

1. `rlpipe up` on two free ports, with RLPIPE_HOME (docs/USAGE.md) and the lake in a new
   temporary folder: the Prefect and MLflow databases of your own `up` are not touched.
2. A short run of the served `rl-train/train` deployment through Prefect's API, as the
   form's Run button starts it: the form's default file (configs/quickstart.toml) with
   RUN_FORM on top (3 RL steps after a 20-step warm start: minutes on 2 CPU cores, too
   short to learn the task, so its rewards are 0). It waits for the flow run to complete
   and for its last progress line to reach the server.
3. Headless Chromium (driven over its DevTools protocol: scripts/chromium_devtools.py;
   --no-sandbox when run as root) loads each page until its text shows what it should (the
   form's fields, the progress lines, the run's metrics and models), then writes PNGs to
   --out, all three or none: ui-deployment-form.png (the form's top over its bottom),
   ui-flow-run-logs.png (the run's header over its Logs tab; its graph left out),
   ui-mlflow-run.png (the run's Overview, MLflow's Assistant panel closed). They are
   reduced to a 256-colour palette: well under 100 KB each.
4. `rlpipe down`, always (also after a failure or ^C), then the temporary folder is removed
   unless the run failed or --keep was given (its path is printed).

Not here: checks of the UIs' behaviour (tests/cli/test_up_serves_train.py does those).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chromium_devtools import BrowserError, HeadlessPage  # scripts/, beside this file
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

RUN_STEPS = 3
RUN_FORM = {
    "train": {"steps": RUN_STEPS},
    "warmstart": {"steps": 20},
    "rollout": {"prompts_per_step": 16},
    "envs": {"heldout_size": 100},
}
"""What the script changes in the train form (the quickstart's file stays the base)."""
UP_TIMEOUT_S = 1200  # hang guards on a loaded machine, not expectations
RUN_TIMEOUT_S = 1800
PAGE_TIMEOUT_S = 300
CONTENT = ".app-router-view__view > *"
"""The Prefect UI's content column, right of its sidebar (CSS classes of Prefect 3's UI)."""
SIDEBAR_LOGO = ".p-context-sidebar__header"
"""The logo at the top of the Prefect UI's sidebar."""
ASSISTANT_CLOSE = "button[aria-label='Close']"
"""The close button of MLflow 3's Assistant panel (the page's only button of that label)."""
WINDOW = (1400, 1000)


class StepFailed(Exception):
    """A step of the script failed; the message says which and where to look."""


@dataclass(frozen=True)
class Shot:
    """One screenshot: the page's URL, the texts it must show before it is taken, the PNG's
    name, the window's height, and how the image is made of the open page."""

    url: str
    expected: tuple[str, ...]
    file_name: str
    compose: Callable[[HeadlessPage], Image.Image]
    height: int = WINDOW[1]


def main() -> int:
    parser = argparse.ArgumentParser(description="PNGs of the train form, a flow run's progress logs and its MLflow run, "
                                                 "from a private `rlpipe up` (see this script's docstring)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "images", help="folder of the PNGs")
    parser.add_argument("--chromium", default=None, help="the Chromium binary (default: chromium on PATH)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (RLPIPE_HOME, lake, logs)")
    args = parser.parse_args()
    chromium = shutil.which(args.chromium) if args.chromium else shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print(f"ui_screenshots: FAILED: {'no executable ' + args.chromium if args.chromium else 'no chromium on PATH'} "
              "(apt-get install -y chromium, or pass --chromium PATH)", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="rlpipe-ui-screenshots-"))
    env = _up_env(workdir)
    failed = True
    try:
        shots = _start_and_run(env, workdir)
        taken = workdir / "png"
        taken.mkdir()
        for shot in shots:
            _take(chromium, shot, taken / shot.file_name, workdir / "chromium")
        args.out.mkdir(parents=True, exist_ok=True)
        for shot in shots:  # all or none: a failed page leaves the old set as it was
            shutil.copyfile(taken / shot.file_name, args.out / shot.file_name)
            print(f"wrote {args.out / shot.file_name} ({(args.out / shot.file_name).stat().st_size // 1024} KB)", flush=True)
        failed = False
    except StepFailed as exc:
        print(f"ui_screenshots: FAILED: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("ui_screenshots: interrupted", file=sys.stderr)
    finally:
        stopped = _rlpipe(["down"], env, workdir, timeout_s=300)
        if stopped.returncode != 0:
            failed = True
            print(f"ui_screenshots: FAILED: `rlpipe down` exited {stopped.returncode}: {stopped.stdout}{stopped.stderr}",
                  file=sys.stderr)
        if failed or args.keep:
            print(f"kept {workdir} (RLPIPE_HOME={workdir / 'home'}, logs in {workdir / 'home' / 'logs'})", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def _up_env(workdir: Path) -> dict[str, str]:
    """The environment of `up` and `down`: a private RLPIPE_HOME, this checkout's rlpipe,
    Prefect's INFO lines (the progress lines are INFO), no server of the caller's."""
    env = dict(os.environ, RLPIPE_HOME=str(workdir / "home"), PREFECT_LOGGING_LEVEL="INFO",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    return env


def _start_and_run(env: dict[str, str], workdir: Path) -> list[Shot]:
    """Steps 1 and 2: `up`, a run of the deployment to its end; the pages to take."""
    from rlpipe.storage.local_services import read_live_services

    ports = _free_ports(2)
    print(f"rlpipe up on ports {ports} (RLPIPE_HOME={env['RLPIPE_HOME']}); a first start takes minutes", flush=True)
    started = _rlpipe(["up", "--prefect-port", str(ports[0]), "--mlflow-port", str(ports[1])], env, workdir, UP_TIMEOUT_S)
    if started.returncode != 0:
        raise StepFailed(f"`rlpipe up` exited {started.returncode}: {(started.stdout + started.stderr)[-2000:]}")
    services = read_live_services(Path(env["RLPIPE_HOME"]))
    if services is None:
        raise StepFailed(f"`rlpipe up` succeeded but left no live services file under {env['RLPIPE_HOME']}")
    print(f"up: Prefect {services.prefect_ui_url}, MLflow {services.mlflow_uri}; starting a {RUN_STEPS}-step run", flush=True)
    form = dict(RUN_FORM, storage={"lake_uri": str(workdir / "lake")})
    deployment_id, flow_run_id, mlflow_url = asyncio.run(
        _run_deployment(services.prefect_api_url, form, Path(env["RLPIPE_HOME"]) / "logs" / "deployments.log"))
    ui = services.prefect_ui_url.rstrip("/")
    return [
        Shot(f"{ui}/deployments/deployment/{deployment_id}/run", ("config (Optional)", "config_path (Optional)", "Submit"),
             "ui-deployment-form.png", _form_top_and_bottom),
        Shot(f"{ui}/runs/flow-run/{flow_run_id}", ("MLflow run: http", "warm start done", f"RL step {RUN_STEPS}/{RUN_STEPS}"),
             "ui-flow-run-logs.png", _header_and_logs, height=2000),
        Shot(mlflow_url, ("Metrics (", "reward/mean", "Registered models"), "ui-mlflow-run.png",
             _run_overview, height=1250),
    ]


async def _run_deployment(api_url: str, form: dict, runner_log: Path) -> tuple[str, str, str]:
    """Start rl-train/train with `form` as its config (the form's other fields as drawn),
    wait for it to complete and for its last progress line; its deployment id, flow run
    id and the MLflow run URL of its logs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("rl-train/train")
            flow_run = await client.create_flow_run_from_deployment(deployment.id, parameters={"config": form})
            print(f"flow run {flow_run.name} ({flow_run.id}); waiting for it to complete", flush=True)
            deadline = time.monotonic() + RUN_TIMEOUT_S
            last_state = None
            while True:
                flow_run = await client.read_flow_run(flow_run.id)
                state = flow_run.state
                if state is not None and state.name != last_state:
                    print(f"  state {state.name}", flush=True)
                    last_state = state.name
                if state is not None and state.is_final():
                    break
                if time.monotonic() > deadline:
                    raise StepFailed(f"the flow run did not finish within {RUN_TIMEOUT_S} s; see {runner_log}")
                await asyncio.sleep(2.0)
            if not state.is_completed():
                raise StepFailed(f"the flow run ended {state.name}: {state.message}; see {runner_log}")
            # the run's process ships its logs in batches, the last ones possibly after its end
            last_line = f"RL step {RUN_STEPS}/{RUN_STEPS}"
            while True:
                logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])),
                                              sort=LogSort.TIMESTAMP_ASC)
                messages = [log.message for log in logs]
                if any(line.startswith(last_line) for line in messages):
                    break
                if time.monotonic() > deadline:
                    raise StepFailed(f"the flow run's logs never had '{last_line}'; see {runner_log}")
                await asyncio.sleep(1.0)
    mlflow_urls = [line.removeprefix("MLflow run: ") for line in messages if line.startswith("MLflow run: http")]
    if not mlflow_urls:
        raise StepFailed(f"the flow run's logs name no MLflow run URL: {messages[:5]}")
    return str(deployment.id), str(flow_run.id), mlflow_urls[0]


def _take(chromium: str, shot: Shot, out: Path, profile: Path) -> None:
    """Open the shot's page in a fresh headless Chromium, wait for its texts, write its PNG
    (reduced to a 256-colour palette)."""
    print(f"taking {shot.file_name} of {shot.url}", flush=True)
    try:
        page = HeadlessPage(chromium, profile, WINDOW[0], shot.height)
    except BrowserError as exc:
        raise StepFailed(f"{out.name}: {exc}") from None
    try:
        page.open(shot.url, shot.expected, PAGE_TIMEOUT_S)
        image = shot.compose(page)
    except BrowserError as exc:
        raise StepFailed(f"{out.name}: {exc}") from None
    finally:
        page.close()
    image.convert("RGB").quantize(colors=256).save(out, optimize=True)


def _viewport(page: HeadlessPage) -> Image.Image:
    return Image.open(io.BytesIO(page.screenshot()))


def _stacked(parts: list[Image.Image]) -> Image.Image:
    """The parts one over the other, a grey rule between them."""
    rule = 4
    stacked = Image.new("RGB", (parts[0].width, sum(part.height for part in parts) + rule * (len(parts) - 1)), (128, 128, 128))
    y = 0
    for part in parts:
        stacked.paste(part, (0, y))
        y += part.height + rule
    return stacked


def _without_sidebar(page: HeadlessPage, image: Image.Image, from_y: int = 0) -> Image.Image:
    """`image` (a part of a Prefect UI page) with the UI's sidebar and the gutter beside it
    painted over from `from_y` down, in the colour of the image's top-left pixel: the page's
    top part shows the sidebar already."""
    painted = image.convert("RGB")
    painted.paste(painted.getpixel((2, 2)), (0, from_y, page.box_of_selector(CONTENT)[0], painted.height))
    return painted


def _form_top_and_bottom(page: HeadlessPage) -> Image.Image:
    """The form is long: its top (run name, the config tables begin) over its bottom
    (run_id, config_path naming the quickstart, Submit)."""
    first = _viewport(page)
    top = first.crop((0, 0, first.width, page.box_of("Architecture (Optional)")[1] - 8))
    page.scroll_to("run_id (Optional)")
    page.settle(PAGE_TIMEOUT_S)
    bottom = _viewport(page)
    bottom = bottom.crop((0, page.box_of("run_id (Optional)")[1] - 24, bottom.width, bottom.height))
    return _stacked([top, _without_sidebar(page, bottom)])


def _header_and_logs(page: HeadlessPage) -> Image.Image:
    """The flow run's header (name, state, deployment) over its Logs tab down to the last
    RL step's line; the run's graph (a canvas) between them is left out."""
    first = _viewport(page)
    header = first.crop((0, 0, first.width, page.box_of_selector("canvas")[1] - 4))
    header = _without_sidebar(page, header, from_y=page.box_of_selector(SIDEBAR_LOGO)[3])
    last_line = f"RL step {RUN_STEPS}/{RUN_STEPS}"
    page.scroll_to(last_line, block="nearest")
    page.settle(PAGE_TIMEOUT_S)
    logs = _viewport(page)
    logs = logs.crop((0, max(0, page.box_of("Logs")[1] - 12), logs.width, min(logs.height, page.box_of(last_line)[3] + 40)))
    return _stacked([header, _without_sidebar(page, logs)])


def _run_overview(page: HeadlessPage) -> Image.Image:
    """The MLflow run's Overview: metrics, parameters, and (right) its logged and registered
    model. MLflow's Assistant panel, which opens itself on a browser's first visit and
    covers that right column, is closed first."""
    if page.has(ASSISTANT_CLOSE):
        page.click(ASSISTANT_CLOSE)
        page.settle(PAGE_TIMEOUT_S)
    return _viewport(page)


def _rlpipe(args: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from rlpipe.cli.main import main; main()", *args]
    try:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, 124, str(exc.stdout or ""), f"timed out after {timeout_s:.0f} s")


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing listens on now (the OS's pick, like a test's)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


if __name__ == "__main__":
    sys.exit(main())
