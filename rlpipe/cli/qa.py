"""`rlpipe qa ENV`: the environment quality gate (rlpipe/qa/ does the checks).

Builds the env (a registered domain, or one defined in a config's envs.reasoning_gym /
envs.files tables with --config FILE; ENV `suite` is a terminal-task suite, the built-in
one or --tasks DIR, whose every answer is a real trial: agents/suite_env.py), a sandbox
pool when the env needs one, runs the gate,
writes report.md / report.json (/ difficulty.png) into --out, and prints a summary (or, with
--json, the report as JSON). Exit status: 0 when every check passes, 1 when the gate finds
a problem, 2 for bad input (unknown env, bad options, a missing config or policy folder).

With --mlflow the report files also go to a new MLflow run ("qa-ENV", in the tracking store
of --config, else the default one), as artifacts under qa/.

What it does not: train, write to the lake, or make a Prefect artifact (the gate before
training does: tasks/quality_gate.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rlpipe.cli.consoles import literal, stdout_console
from rlpipe.cli.sandbox import Backend
from rlpipe.core.errors import ConfigError
from rlpipe.sandbox.docker_owners import reap_in_background

GATE_FAILED_EXIT_CODE = 1
SUITE = "suite"  # ENV for a terminal-task suite: the built-in one, or --tasks DIR
console = stdout_console()


def _check_options(samples: int, repeats: int, k: int, policy_samples: int, policy: Optional[Path]) -> None:
    if samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {samples}", "e.g. --samples 10 (tasks per split)")
    if repeats < 2:
        raise ConfigError(f"--repeats must be >= 2, got {repeats}", "the consistency check compares repeated verdicts: e.g. --repeats 3")
    if not 1 <= k <= policy_samples:
        raise ConfigError(f"--k must be between 1 and --policy-samples ({policy_samples}), got {k}", "e.g. --k 4 --policy-samples 8")
    if policy is not None:
        from rlpipe.rl.checkpoint_layout import LEGACY_POLICY_DIR

        if not policy.is_dir():
            raise ConfigError(f"--policy {policy} is not a folder", "pass a policy folder saved by rlpipe (a checkpoint's step=N folder)")
        if not (policy / "config.json").is_file() and (policy / LEGACY_POLICY_DIR / "config.json").is_file():
            raise ConfigError(f"--policy {policy} is a checkpoint folder of the older layout, not its policy",
                              f"pass {policy / LEGACY_POLICY_DIR}")


def qa(
    env: str = typer.Argument(..., help="The domain to check: a registered one (arithmetic, reverse, code, ...) or one defined in --config."),
    samples: int = typer.Option(10, "--samples", help="Tasks drawn from EACH split (train and held-out)."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="A policy folder saved by rlpipe (HF layout): measure pass@k per task."),
    config: Optional[Path] = typer.Option(None, "--config", help="A run config whose envs.* tables define ENV (e.g. configs/reasoning_gym.toml)."),
    out: Path = typer.Option(Path("qa-report"), "--out", help="Folder for report.md, report.json and difficulty.png."),
    json_out: bool = typer.Option(False, "--json", help="Print the report (findings included) as JSON."),
    repeats: int = typer.Option(3, "--repeats", help="Times each reference and known-wrong answer is verified."),
    seed: int = typer.Option(0, "--seed", help="Seed of the task sample and the policy's sampling."),
    backend: Backend = typer.Option(Backend.bwrap, "--backend", help="Sandbox backend for envs that need one."),
    timeout_s: Optional[float] = typer.Option(None, "--timeout-s", help="The env's verification time limit (envs that take timeout_s)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Sandboxes in the pool (default: by cores and memory, at most 4)."),
    k: int = typer.Option(4, "--k", help="pass@k's k (with --policy)."),
    policy_samples: int = typer.Option(8, "--policy-samples", help="Completions sampled per task (with --policy)."),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", help="Tokens per completion (with --policy)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature (with --policy)."),
    prompt_format: Optional[str] = typer.Option(None, "--prompt-format", help="plain or chat (with --policy; default: --config's model.prompt_format, else plain)."),
    mlflow: bool = typer.Option(False, "--mlflow", help="Also log the report to a new MLflow run (the tracking store of --config, else the default)."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help="With ENV suite: a Harbor-format task folder, or a folder of them (default: the built-in suite)."),
) -> None:
    """Gate an environment: solvability, verifier consistency, reward-hack probes, difficulty."""
    reap_in_background()  # containers a killed eval left (docker_owners.py)
    from rlpipe.qa.gate import PolicyOptions
    from rlpipe.qa.report import write_report
    from rlpipe.qa.standalone import GateRequest, build_env_for_gate, gate_env

    _check_options(samples, repeats, k, policy_samples, policy)
    if prompt_format not in (None, "plain", "chat"):
        raise ConfigError(f"--prompt-format must be plain or chat, got {prompt_format!r}", "e.g. --prompt-format chat for instruct models")
    if tasks is not None and env != SUITE:
        raise ConfigError(f"--tasks goes with ENV {SUITE}, got {env!r}", f"rlpipe qa {SUITE} --tasks DIR")
    if env == SUITE:  # terminal tasks: each answer is a real trial (agents/suite_env.py)
        from rlpipe.agents.suite_env import SuiteEnv

        environment, config_prompt_format = SuiteEnv(tasks, backend.value), None
        for task_id, reason in sorted(environment.skipped.items()):
            typer.echo(f"skipped task {task_id}: {reason}", err=True)  # not gated, never dropped silently
    else:
        environment, config_prompt_format = build_env_for_gate(env, config, timeout_s)
    prompt_format = prompt_format or config_prompt_format or "plain"
    policy_options = None if policy is None else PolicyOptions(str(policy), k=k, samples=policy_samples, max_new_tokens=max_new_tokens,
                                                                temperature=temperature, prompt_format=prompt_format)
    request = GateRequest(env=env, samples=samples, repeats=repeats, seed=seed, backend=backend.value, config_path=config,
                          timeout_s=timeout_s, workers=workers, policy=policy_options)
    from rlpipe.controller.agent_episodes import gate_verify

    report = gate_env(request, environment, verify_one=gate_verify)
    written = write_report(report, out)
    if mlflow:
        _log_to_mlflow(report, written, config)
    if json_out:
        typer.echo(json.dumps(report.to_dict()))
    else:
        _print_summary(report, written)
    if not report.passed:
        raise typer.Exit(GATE_FAILED_EXIT_CODE)


def _log_to_mlflow(report, written: list[Path], config: Optional[Path]) -> None:
    """A new MLflow run holding the report files under qa/; its id and artifacts on stderr."""
    from rlpipe.cli.consoles import stderr_console
    from rlpipe.core.config import load_config
    from rlpipe.controller.builders import build_tracker

    tracker = build_tracker(load_config(config, []))
    run_id = tracker.start_run(run_name=f"qa-{report.env}", tags={"rlpipe.qa.env": report.env, "rlpipe.qa.passed": str(report.passed).lower()},
                               params={"verifier_version": report.verifier_version, "tasks": str(len(report.task_ids))})
    for path in written:
        tracker.log_artifact(run_id, path, "qa")
    tracker.end_run(run_id, "FINISHED")
    stderr_console().print(f"mlflow: run {run_id}, report in {literal(tracker.artifact_uri(run_id, 'qa'))}")


def _print_summary(report, written: list[Path]) -> None:
    for check in report.checks:
        mark = "[green]pass[/]" if check.passed else "[bold red]FAIL[/]"
        console.print(f"{mark} {check.name}: {check.verifications} verifications, {len(check.findings)} findings")
        for finding in check.findings[:5]:
            console.print(f"    {literal(finding.task_id)} {literal(finding.answer)}: {literal(finding.problem)} "
                          f"(reward {finding.reward}, {finding.reason})")
        if len(check.findings) > 5:
            console.print(f"    ... {len(check.findings) - 5} more in the report")
    if report.difficulty is None:
        console.print(f"difficulty: skipped ({literal(report.difficulty_skipped)})")
    else:
        difficulty = report.difficulty
        console.print(f"difficulty: mean pass@1 {difficulty.mean_pass_at_1:.3f}, mean pass@{difficulty.k} "
                      f"{difficulty.mean_pass_at_k:.3f} over {len(difficulty.tasks)} tasks")
    verdict = "[green]PASSED[/]" if report.passed else f"[bold red]FAILED[/] ({len(report.findings)} findings)"
    console.print(f"env {literal(report.env)} (verifier {report.verifier_version}): {verdict}; report: {literal(written[0])}")
