"""`rlpipe verify code --completions FILE`: bad files are clear errors (exit 2), good ones are scored.

Error cases run on a 40-column console with the file nested past 200 characters: the message
must arrive whole on one line (no assertion on the width itself)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlpipe.cli.main import app
from rlpipe.cli.verify import Sample, pass_at_k
from rlpipe.core.records import Verdict, VerdictReason
from rlpipe.envs.code import CodeEnv

runner = CliRunner()


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def verify_cli(*args):
    return runner.invoke(app, ["verify", "code", *args], env={"COLUMNS": "40"})


def deep_folder(tmp_path):
    folder = tmp_path.joinpath(*["nested-folder-" + "y" * 36] * 4)  # 4 x 50 characters
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (['{"task_id": "HumanEval/0", "completion": "x"}', "{oops"], ":2: not valid JSON"),
        (['{"task_id": "HumanEval/999", "completion": "x"}'], ":1: unknown task_id 'HumanEval/999'"),
        (['["HumanEval/0", "x"]'], ":1: needs string fields task_id and completion"),
        (['{"task_id": "HumanEval/0"}'], ":1: needs string fields task_id and completion"),
        ([""], "holds no samples"),
    ],
)
def test_a_bad_completions_file_is_a_clear_error_with_its_line(tmp_path, lines, expected):
    path = write_lines(deep_folder(tmp_path) / "samples.jsonl", lines)
    result = verify_cli("--completions", str(path))
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and str(path) in error[0] and expected in error[0], result.output
    assert "Traceback" not in result.output


def test_a_missing_file_and_an_unknown_env_exit_2(tmp_path):
    assert verify_cli("--completions", str(tmp_path / "nope.jsonl")).exit_code == 2
    unknown = runner.invoke(app, ["verify", "nope", "--completions", str(write_lines(tmp_path / "s.jsonl", ["{}"]))])
    assert unknown.exit_code == 2 and "unknown domain" in unknown.output


def test_pass_at_k_uses_the_unbiased_estimator_per_task():
    env = CodeEnv()
    first, second = env.task("HumanEval/0"), env.task("HumanEval/1")
    samples = [Sample(i, task, "") for i, task in enumerate([first, first, second, second])]
    verdicts = [Verdict(reward=float(p), passed=p, reason=VerdictReason.OK if p else VerdictReason.WRONG)
                for p in (True, False, True, True)]
    # task 0: n=2, c=1 -> pass@1 = 1/2, pass@2 = 1; task 1: n=2, c=2 -> 1, 1; means: 0.75 and 1.0
    assert pass_at_k(samples, verdicts) == {"pass@1": 0.75}  # pass@10 needs 10 samples per task


def test_a_good_file_is_scored_per_sample_with_pass_at_1(tmp_path):
    from rlpipe.sandbox.bwrap import bwrap_available

    backend = "bwrap" if not bwrap_available() else "docker"
    if backend == "docker":
        from rlpipe.core.errors import SandboxUnavailable
        from rlpipe.sandbox.docker_backend import docker_client

        try:
            docker_client()
        except SandboxUnavailable:
            pytest.skip("neither bwrap nor docker can start sandboxes here")
    env = CodeEnv()
    lines = []
    for task_id in ("HumanEval/0", "HumanEval/1"):
        lines.append(json.dumps({"task_id": task_id, "completion": env.task(task_id).reference_answer}))
        lines.append(json.dumps({"task_id": task_id, "completion": "    pass\n"}))
    result = verify_cli("--completions", str(write_lines(tmp_path / "s.jsonl", lines)), "--backend", backend,
                        "--json", "--workers", "2")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [row["passed"] for row in report["samples"]] == [True, False, True, False]
    assert report["pass@1"] == 0.5 and report["unscored"] == 0
    assert report["verifier_version"] == env.verifier_version
