"""`rlpipe qa` on the code env (bubblewrap; the 30 attacks of envs/code_probes.py included),
the difficulty section with a policy folder, and the gate's arithmetic (pass@k, histogram,
perturbed answers)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlpipe.cli.main import app
from rlpipe.core.errors import SandboxUnavailable
from rlpipe.envs.code_probes import PROBES
from rlpipe.qa.answers import change_char, perturbations
from rlpipe.qa.difficulty import histogram, pass_at_k
from rlpipe.sandbox.base import Limits

runner = CliRunner()


@pytest.mark.bwrap
def test_the_code_env_passes_the_gate_on_bwrap(tmp_path):
    from rlpipe.sandbox.bwrap import BwrapSandbox

    try:
        BwrapSandbox(Limits()).close()
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap sandboxes cannot start here: {exc.message}")
    # the slow probes end by the timeout: 2 s keeps the test short and still lets every test run
    result = runner.invoke(app, ["qa", "code", "--samples", "1", "--repeats", "2", "--timeout-s", "2", "--workers", "2",
                                 "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    probes = next(check for check in report["checks"] if check["name"] == "probes")
    assert f"{len(PROBES)} code attacks of envs/code_probes.py" in probes["notes"]
    assert report["passed"] and report["findings"] == []


def test_difficulty_with_a_policy_folder_writes_pass_at_k_and_a_histogram(tmp_path):
    from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model("qwen2", len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                             max_position_embeddings=64, seed=0)
    policy = tmp_path / "policy"
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    result = runner.invoke(app, ["qa", "reverse", "--samples", "2", "--policy", str(policy), "--k", "2",
                                 "--policy-samples", "3", "--max-new-tokens", "4", "--out", str(tmp_path / "report"), "--json"])
    assert result.exit_code == 0, result.output
    difficulty = json.loads(result.stdout)["difficulty"]
    assert difficulty["k"] == 2 and len(difficulty["tasks"]) == 4  # 2 train + 2 held-out words
    assert all(task["samples"] == 3 and 0 <= task["correct"] <= 3 for task in difficulty["tasks"])
    assert sum(difficulty["histogram"].values()) == 4
    assert (tmp_path / "report" / "difficulty.png").stat().st_size > 0
    assert "difficulty.png" in (tmp_path / "report" / "report.md").read_text()


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # 1 - C(3,1)/C(5,1) = 1 - 3/5
    assert pass_at_k(4, 3, 2) == 1.0  # 4 - 3 = 1 < 2: every pair holds a pass
    assert pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_the_histogram_keeps_0_and_100_percent_apart():
    assert dict(histogram([0.0, 0.0, 0.25, 0.5, 0.9, 1.0])) == {
        "0%": 2, "(0, 25%]": 1, "(25, 50%]": 1, "(50, 75%]": 0, "(75, 100%)": 1, "100%": 1}


def test_perturbed_answers_differ_from_the_reference():
    assert change_char("19", 1) == "10" and change_char("olleh", 4) == "ollei" and change_char("Z", 0) == "A"
    assert perturbations("17 + 25 = 42") == [("last_char", "17 + 25 = 43"), ("first_char", "27 + 25 = 42")]
    assert perturbations("-5") == [("last_char", "-6")]
    assert perturbations("()") == [("appended_char", "()0")]
