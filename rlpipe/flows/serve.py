"""Serve rlpipe's flows as deployments from one long-lived process, with Prefect's own runner
(`prefect.serve`): `python -m rlpipe.flows.serve`, started by `rlpipe up` beside its Prefect
server (PREFECT_API_URL points at it) and stopped by `rlpipe down`.

Served deployments (named `<flow>/<deployment>` in the UI and the API):

- `rl-train/train`: a training run from a form (the RunConfig tables with their defaults,
  an optional TOML file path, an optional run id: flows/train.py). The form's config_path
  names the quickstart's file (flows/run_parameters.py QUICKSTART_CONFIG, where the
  checkout has it), so Run as drawn trains the quickstart, and the form's changes go on top
  of it as `--set` would (e.g. train.steps = 5). Each flow run runs in a
  subprocess of this one; its worker processes are its own children. A retry of a failed or
  crashed flow run (the UI's Retry button) runs it again here and resumes from the lake.
  The nightly schedule is declared inactive: turn it on in the UI.
- `rl-eval/eval`: go on with a stored eval session (`rlpipe eval` creates one; its id).
- `rl-qa/qa`: the quality gate of one env (Failed when it finds a problem).
- `rl-rescore/rescore`: re-verify a finished run's trajectories into a new table.

What it does not: start servers (cli/services.py), register deployments for work pools
(prefect.yaml at the repository root: `prefect deploy --all`), or declare queues and
concurrency limits (flows/operations.py).
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron

from rlpipe.flows.eval import rl_eval
from rlpipe.flows.offline_checks import rl_qa, rl_rescore
from rlpipe.flows.operations import NIGHTLY_CRON, TRAIN_CONCURRENCY, TRAIN_TAGS
from rlpipe.flows.operations import main as apply_operations_main
from rlpipe.flows.run_parameters import QUICKSTART_CONFIG
from rlpipe.flows.train import train

RUNNER_LIMIT = 2
"""Flow runs this process runs at once (each train run holds an engine and a trainer worker)."""


def served_deployments() -> list[RunnerDeployment]:
    return [
        train.to_deployment(
            name="train",
            description="GRPO training from a form. config_path is a TOML file on this machine (the quickstart's, "
                        "as drawn; clear it to start from the defaults alone); the values you change in the config "
                        "tables go on top of the file's, as `--set` does on the command line (the form's win). "
                        "An empty run_id starts a new run, an existing one resumes it.",
            parameters=_train_form_defaults(),
            tags=list(TRAIN_TAGS),
            concurrency_limit=TRAIN_CONCURRENCY,
            schedules=[Cron(NIGHTLY_CRON, timezone="UTC", active=False)],
        ),
        rl_eval.to_deployment(
            name="eval",
            description="Go on with a stored eval session (its id and lake, from `rlpipe eval`): unfinished trials run.",
            tags=["rlpipe", "eval"],
        ),
        rl_qa.to_deployment(
            name="qa",
            description="The environment quality gate of one env: solvability, verifier consistency, reward-hack probes.",
            tags=["rlpipe", "qa"],
        ),
        rl_rescore.to_deployment(
            name="rescore",
            description="Re-verify a finished run's trajectories with today's verifiers; the run's rows stay as they are.",
            tags=["rlpipe", "rescore"],
        ),
    ]


def _train_form_defaults() -> dict[str, str]:
    """What the train form shows before anyone edits it: the quickstart's file, a run of minutes."""
    return {"config_path": str(QUICKSTART_CONFIG)} if QUICKSTART_CONFIG.is_file() else {}


def main() -> None:
    """Create the work pool, queues and limits (flows/operations.py), then serve until stopped."""
    apply_operations_main()
    serve(*served_deployments(), limit=RUNNER_LIMIT, print_starting_message=False)


if __name__ == "__main__":
    main()
