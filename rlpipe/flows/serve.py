"""Serve rlpipe's flows as deployments from one long-lived process, with Prefect's own runner
(`prefect.serve`): `python -m rlpipe.flows.serve`, started by `rlpipe up` beside its Prefect
server (PREFECT_API_URL points at it) and stopped by `rlpipe down`.

Served deployments (named `<flow>/<deployment>` in the UI and the API):

- `rl-train/train`: a training run from a form (the RunConfig tables with their defaults,
  an optional TOML file path, an optional run id: flows/train.py). Each flow run runs in a
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
from rlpipe.flows.train import train

RUNNER_LIMIT = 2
"""Flow runs this process runs at once (each train run holds an engine and a trainer worker)."""


def served_deployments() -> list[RunnerDeployment]:
    return [
        train.to_deployment(
            name="train",
            description="GRPO training from a form: edit the config tables (defaults shown) or name a TOML file on "
                        "this machine; an empty run_id starts a new run, an existing one resumes it.",
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


def main() -> None:
    """Create the work pool, queues and limits (flows/operations.py), then serve until stopped."""
    apply_operations_main()
    serve(*served_deployments(), limit=RUNNER_LIMIT, print_starting_message=False)


if __name__ == "__main__":
    main()
