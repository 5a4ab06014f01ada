"""The `rl-qa` and `rl-rescore` flows: the environment quality gate and the re-score of a
finished run, deployable beside `rl-train` and `rl-eval` (`rlpipe up` serves them;
prefect.yaml declares them for a work pool).

    rl-qa:      qa-env            (tasks/offline_checks.py; Failed when the gate finds a problem)
    rl-rescore: rescore-run       (a new verdict table beside the run's; what flipped, by domain)

Each is one task run: the work inside fans out on its own sandbox pool. Flows import only
tasks/ and core/ (an import-linter contract).
"""

from __future__ import annotations

from prefect import flow

from rlpipe.controller.rescore import RescoreSummary
from rlpipe.tasks import offline_checks
from rlpipe.tasks.offline_checks import EnvGateOutcome


@flow(name="rl-qa", flow_run_name="qa-{env}")
def rl_qa(env: str, samples: int = 10, repeats: int = 3, seed: int = 0, backend: str = "bwrap",
          config_path: str | None = None) -> EnvGateOutcome:
    """Gate one environment: solvability, verifier consistency, reward-hack probes.

    Args:
        env: A registered domain (arithmetic, reverse, code, ...) or one a config's envs tables define.
        samples: Tasks drawn from each split (train and held-out).
        repeats: Times each reference and known-wrong answer is verified.
        seed: Seed of the task sample.
        backend: Sandbox backend (bwrap or docker) for envs that need one.
        config_path: A run config (TOML, on the worker) whose envs.* tables define `env`.
    """
    return offline_checks.qa_env(env, samples, repeats, seed, backend, config_path)


@flow(name="rl-rescore", flow_run_name="rescore-{run_id}")
def rl_rescore(run_id: str, lake_uri: str, env: str | None = None, backend: str | None = None,
               use_cache: bool = True) -> RescoreSummary:
    """Re-verify a run's stored trajectories with today's verifiers; the run's own rows stay as they are.

    Args:
        run_id: The run whose committed trajectories are re-verified.
        lake_uri: The lake that holds it (a folder or s3://bucket/prefix).
        env: Only this domain of the run (empty: every domain).
        backend: Sandbox backend for code domains (empty: the run's own).
        use_cache: Take verdicts the current verifier version already gave from the verdict cache.
    """
    return offline_checks.rescore(run_id, lake_uri, env, backend, use_cache)
