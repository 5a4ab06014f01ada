"""`rlpipe rescore`: a finished run's trajectories re-verified after a verifier change list
the flipped verdicts by domain, land in a new table (`rescores` view), leave every file of
the run byte-identical, and are not re-run when the same verifier version judged them.

The run is written straight into a local lake with the Lake API (run.json with a tiny
config, two committed steps of arithmetic and reverse rows judged by today's verifiers), no
training. The verifier change is a new arithmetic verifier registered in-process under the
domain's name: it compares numbers ("95.0" now passes) and no longer strips whitespace
("95 " now fails).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlpipe.cli.main import app
from rlpipe.core.config import load_config
from rlpipe.core.records import Completion, Task, Trajectory, Verdict, VerdictReason
from rlpipe.envs import mixture
from rlpipe.envs.arithmetic import ArithmeticEnv
from rlpipe.envs.reverse import ReverseEnv
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunInfo, StepManifest
from rlpipe.storage.query import query_trajectories
from rlpipe.storage.rescores import RescoreStore

runner = CliRunner()
RUN = "finished-run"


class NumericArithmetic(ArithmeticEnv):
    """The changed verifier: the answer as a number, exactly as written (no whitespace)."""

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.verifier_version = "numeric-v2"

    def verify(self, task: Task, completion_text: str, sandbox=None) -> Verdict:
        try:
            passed = " " not in completion_text and float(completion_text) == float(task.verifier.payload)
        except ValueError:
            passed = False
        return Verdict(reward=float(passed), passed=passed, reason=VerdictReason.OK if passed else VerdictReason.WRONG,
                       detail="" if passed else f"{completion_text!r} is not {task.verifier.payload}", verifier_version=self.verifier_version)


def _row(env, step: int, task: Task, index: int, text: str, verdict: Verdict | None = None) -> Trajectory:
    """A committed row; its verdict is `env`'s unless given."""
    completion = Completion(task_id=task.task_id, sample_idx=index, text=text, prompt_token_ids=(1, 2), token_ids=(3,),
                            logprobs=(-0.5,), finish_reason="stop", policy_version=step)
    return Trajectory(run_id=RUN, step=step, policy_version=step, task=task, completion=completion,
                      verdict=verdict or env.verify(task, text), advantage=0.0)


def _commit(lake: Lake, step: int, rows: list[Trajectory]) -> None:
    part = lake.write_part(RUN, step, "0", rows)
    lake.commit_step(StepManifest(run_id=RUN, step=step, policy_version=step, parts=(part,), rows=len(rows),
                                  metrics=(), committed_at_ms=int(time.time() * 1000)))


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    """A lake with run RUN: step 1 and 2, 8 arithmetic rows and 2 reverse rows (see the counts in the tests)."""
    lake_dir = tmp_path / "lake"
    config = load_config(None, [f'storage.lake_uri="{lake_dir}"', "envs.domains={arithmetic = 0.5, reverse = 0.5}"])
    lake = Lake.open(str(lake_dir))
    lake.write_run_info(RunInfo(run_id=RUN, config_json=config.model_dump_json(), config_hash=config.config_hash(),
                                code_version="test", created_at_ms=1))
    arithmetic, reverse = ArithmeticEnv(), ReverseEnv()
    a, b, c = arithmetic.tasks("train", 3, seed=0)
    word = reverse.tasks("train", 1, seed=0)[0]
    x, y, z = (task.verifier.payload for task in (a, b, c))
    _commit(lake, 1, [_row(arithmetic, 1, a, 0, x), _row(arithmetic, 1, a, 1, f"{x}.0"), _row(arithmetic, 1, a, 2, f"{x} "),
                      _row(arithmetic, 1, a, 3, str(int(x) + 1)),
                      _row(reverse, 1, word, 0, word.verifier.payload), _row(reverse, 1, word, 1, "zzz")])
    _commit(lake, 2, [_row(arithmetic, 2, b, 0, y), _row(arithmetic, 2, b, 1, f"{y}.0"), _row(arithmetic, 2, b, 2, f"{y} "),
                      _row(arithmetic, 2, c, 0, z)])
    return lake_dir


def _digests(lake_dir: Path) -> dict[str, str]:
    return {str(path.relative_to(lake_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(lake_dir.rglob("*")) if path.is_file()}


def _rescore(lake_dir: Path, *args: str):
    return runner.invoke(app, ["rescore", RUN, "--lake", str(lake_dir), *args])


def test_rescore_lists_flips_by_domain_and_leaves_the_run_byte_identical(finished_run, monkeypatch):
    before = _digests(finished_run)
    monkeypatch.setitem(mixture._REGISTRY, "arithmetic", NumericArithmetic)
    result = _rescore(finished_run, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    by_domain = {domain["domain"]: domain for domain in summary["domains"]}
    # arithmetic, 8 rows: "x " and "y " pass -> fail (2); "x.0" and "y.0" fail -> pass (2);
    # x, y, z still pass, x+1 still fails. Every row judged by a new version: 8 verified.
    assert (by_domain["arithmetic"]["pass_to_fail"], by_domain["arithmetic"]["fail_to_pass"]) == (2, 2)
    assert (by_domain["arithmetic"]["verified"], by_domain["arithmetic"]["cached"]) == (8, 0)
    assert by_domain["arithmetic"]["current_version"] == "numeric-v2"
    assert by_domain["arithmetic"]["stored_versions"] == [ArithmeticEnv().verifier_version]
    flips = {(example["flip"], example["completion"].strip().endswith(".0")) for example in by_domain["arithmetic"]["examples"]}
    assert flips == {("pass->fail", False), ("fail->pass", True)}
    # reverse, 2 rows: its verifier did not change, so both verdicts come from the rows themselves
    assert (by_domain["reverse"]["pass_to_fail"], by_domain["reverse"]["fail_to_pass"], by_domain["reverse"]["cached"]) == (0, 0, 2)
    assert (summary["rows"], summary["verified"], summary["cached"], summary["flipped"]) == (10, 8, 2, 4)

    after = _digests(finished_run)
    new = sorted(set(after) - set(before))
    assert {path: after[path] for path in before} == before  # every file of the run: the same bytes
    assert all(path.startswith((f"runs/{RUN}/rescores/{summary['rescore_id']}/", "verdicts/")) for path in new), new
    assert f"runs/{RUN}/rescores/{summary['rescore_id']}/RESCORE.json" in new

    counted = query_trajectories(Lake.open(str(finished_run)),
                                 "select domain, flip, count(*) from rescores where flip is not null group by 1, 2 order by 2")
    assert counted.rows == [("arithmetic", "fail->pass", 2), ("arithmetic", "pass->fail", 2)]
    joined = query_trajectories(Lake.open(str(finished_run)),
                                "select count(*) from rescores r join trajectories t using (run_id, step, task_id, sample_idx) "
                                "where r.old_passed = t.passed and r.old_verifier_version = t.verifier_version")
    assert joined.rows == [(10,)]  # every rescored row points at its trajectory and keeps its old verdict


def test_a_second_rescore_takes_every_verdict_from_the_cache(finished_run, monkeypatch):
    monkeypatch.setitem(mixture._REGISTRY, "arithmetic", NumericArithmetic)
    first = json.loads(_rescore(finished_run, "--json").stdout)
    second_result = _rescore(finished_run)
    assert second_result.exit_code == 0, second_result.output
    assert "10 rows, 0 verified, 10 cached; 4 flipped" in second_result.stdout
    assert "arithmetic (verifier " in second_result.stdout and "pass->fail 2, fail->pass 2" in second_result.stdout
    lake = Lake.open(str(finished_run))
    manifests = RescoreStore(lake).manifests(RUN)
    assert [m.rescore_id for m in manifests][0] == first["rescore_id"] and len(manifests) == 2
    assert [(m.verified, m.cached) for m in manifests] == [(8, 2), (0, 10)]
    # --no-cache re-runs all 10, with the same verdicts
    forced = json.loads(_rescore(finished_run, "--json", "--no-cache").stdout)
    assert (forced["verified"], forced["cached"], forced["flipped"]) == (10, 0, 4)


def test_rescore_of_one_env_only(finished_run, monkeypatch):
    monkeypatch.setitem(mixture._REGISTRY, "arithmetic", NumericArithmetic)
    summary = json.loads(_rescore(finished_run, "--env", "reverse", "--json").stdout)
    assert [domain["domain"] for domain in summary["domains"]] == ["reverse"]
    assert (summary["rows"], summary["flipped"], summary["env"]) == (2, 0, "reverse")


@pytest.mark.parametrize("case", ["unknown run", "unknown env", "empty run", "no lake"])
def test_bad_input_is_a_clear_error_with_exit_2(finished_run, tmp_path, case):
    lake = Lake.open(str(finished_run))
    if case == "empty run":
        info = lake.read_run_info(RUN)
        lake.write_run_info(replace(info, run_id="empty-run"))
    args = {"unknown run": ["rescore", "nope", "--lake", str(finished_run)],
            "unknown env": ["rescore", RUN, "--lake", str(finished_run), "--env", "code"],
            "empty run": ["rescore", "empty-run", "--lake", str(finished_run)],
            "no lake": ["rescore", RUN, "--lake", str(tmp_path / "missing")]}[case]
    expected = {"unknown run": "holds no run 'nope'", "unknown env": f"run {RUN!r} has no domain 'code'",
                "empty run": "run 'empty-run' has no committed trajectories", "no lake": "missing"}[case]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert expected in result.output and "hint" in result.output
    assert "Traceback" not in result.output
    assert not (finished_run / "runs" / RUN / "rescores").exists()


def test_code_rows_are_rescored_on_a_sandbox_pool(tmp_path):
    """Code verdicts from an older harness version (it passed an empty body, failed the
    canonical solution) are judged again in bubblewrap sandboxes: both flip, the cache then
    answers a second rescore without a sandbox run."""
    from tests.sandbox._bwrap_support import require_bwrap

    require_bwrap()
    from rlpipe.envs.code import CodeEnv

    lake_dir = tmp_path / "lake"
    config = load_config(None, [f'storage.lake_uri="{lake_dir}"', "envs.domains={code = 1.0}", "sandbox.pool_size=1"])
    lake = Lake.open(str(lake_dir))
    lake.write_run_info(RunInfo(run_id=RUN, config_json=config.model_dump_json(), config_hash=config.config_hash(),
                                code_version="test", created_at_ms=1))
    task = CodeEnv().task("HumanEval/0")

    def old_verdict(passed: bool) -> Verdict:
        return Verdict(reward=float(passed), passed=passed, reason=VerdictReason.OK if passed else VerdictReason.WRONG,
                       verifier_version="harness-old")

    _commit(lake, 1, [_row(None, 1, task, 0, task.reference_answer, old_verdict(False)), _row(None, 1, task, 1, "", old_verdict(True))])
    first = json.loads(_rescore(lake_dir, "--json").stdout)
    (code,) = first["domains"]
    assert (code["pass_to_fail"], code["fail_to_pass"], code["verified"], code["stored_versions"]) == (1, 1, 2, ["harness-old"])
    second = json.loads(_rescore(lake_dir, "--json").stdout)
    assert (second["verified"], second["cached"], second["flipped"]) == (0, 2, 2)


def test_batches_give_the_rescore_of_the_whole_run_a_bounded_part_at_a_time(finished_run, monkeypatch):
    monkeypatch.setitem(mixture._REGISTRY, "arithmetic", NumericArithmetic)
    whole, batched = _rescore(finished_run, "--json", "--no-cache"), _rescore(finished_run, "--json", "--no-cache", "--batch-rows", "3")
    assert whole.exit_code == 0 and batched.exit_code == 0, whole.output + batched.output
    whole, batched = json.loads(whole.stdout), json.loads(batched.stdout)
    ignore = ("rescore_id",)
    assert {k: v for k, v in whole.items() if k not in ignore} == {k: v for k, v in batched.items() if k not in ignore}
    lake = Lake.open(str(finished_run))
    store = RescoreStore(lake)
    manifests = {m.rescore_id: m for m in store.manifests(RUN)}
    assert [part.rows for part in manifests[batched["rescore_id"]].parts] == [3, 3, 3, 1]  # step 1: 6 rows, step 2: 4
    assert [part.rows for part in manifests[whole["rescore_id"]].parts] == [6, 4]

    def rows(rescore_id: str) -> list[tuple]:
        columns = "step, task_id, sample_idx, completion_sha256, old_passed, passed, reason, verifier_version, cached, flip"
        return query_trajectories(lake, f"select {columns} from rescores where rescore_id = '{rescore_id}' order by all").rows

    assert rows(batched["rescore_id"]) == rows(whole["rescore_id"]) and len(rows(whole["rescore_id"])) == 10
