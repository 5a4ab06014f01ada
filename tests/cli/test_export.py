"""Models out: `rlpipe export RUN [--step K] DIR` writes an HF folder from a local or S3 lake
(workers/policy_export.py), and the end of a run logs the same folder to MLflow, as an
artifact folder and as a registered logged model whose pyfunc generates greedily
(orchestration/track.py `upload_policy`, storage/mlflow_model.py; the train flow's own run is checked in
tests/flows/test_train_flow.py).

The lakes here hold real checkpoints of tiny models, written by the trainer's own code
(rl/checkpoint.py `save_checkpoint`, then `Lake.save_checkpoint`), without a training run:
a full-weights run with checkpoints at steps 0 and 2, a LoRA run (adapter B made non-zero,
so the merged weights differ from the base), and a run with no checkpoint yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import mlflow.pyfunc
import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from rlpipe.cli.main import app
from rlpipe.core.config import RunConfig
from rlpipe.orchestration.track import MODEL_ARTIFACT, upload_policy
from rlpipe.rl.checkpoint import CheckpointMeta, save_checkpoint
from rlpipe.rl.lora import apply_lora, merged_copy
from rlpipe.rl.policy import build_char_tokenizer, build_tiny_model
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import RunInfo
from rlpipe.storage.tracking import Tracker
from tests.cli.cli_process import REPO_ROOT
from tests.helpers.mlflow_db import seed_mlflow_db
from tests.helpers.s3_server import unique_bucket

runner = CliRunner()
PROMPT = "12+7="


class Lakes(NamedTuple):
    lake: Lake
    logits: dict[tuple[str, int], torch.Tensor]  # (run, step) -> logits of PROMPT by the checkpointed policy
    token_ids: list[int]  # PROMPT through the run's tokenizer


def _tiny(seed: int):
    tokenizer = build_char_tokenizer()
    return build_tiny_model("qwen2", len(tokenizer), hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                            max_position_embeddings=64, seed=seed), tokenizer


def _logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits


def _checkpoint(lake: Lake, run_id: str, step: int, model, tokenizer, folder: Path) -> None:
    save_checkpoint(folder, model, tokenizer, {}, CheckpointMeta(step, step, "test"))
    lake.save_checkpoint(run_id, step, folder)


def _write_lake(lake: Lake, work: Path) -> Lakes:
    config_json = RunConfig().model_dump_json()
    for run_id in ("full", "lora", "fresh"):
        lake.write_run_info(RunInfo(run_id, config_json, "test", "test", 0, mlflow_run_id=f"m-{run_id}", prefect_flow_run_id=f"p-{run_id}"))
    logits = {}
    for step, seed in ((0, 0), (2, 1)):  # two steps, two different policies
        model, tokenizer = _tiny(seed)
        token_ids = tokenizer(PROMPT)["input_ids"]
        _checkpoint(lake, "full", step, model, tokenizer, work / f"full-{step}")
        logits[("full", step)] = _logits(model, token_ids)
    # a kill during the save of step 5 left files but no CHECKPOINT.json: not a checkpoint
    lake.objects.put("checkpoints/full/step=000005/config.json", b"{}")
    model, tokenizer = _tiny(2)
    peft_model = apply_lora(model, rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if ".lora_B." in name:  # zero at init: make the adapter change the model
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    _checkpoint(lake, "lora", 1, peft_model, tokenizer, work / "lora-1")
    logits[("lora", 1)] = _logits(merged_copy(peft_model), token_ids)
    base_logits = _logits(build_tiny_model("qwen2", len(tokenizer), hidden_size=32, num_layers=1, num_heads=4,
                                           intermediate_size=64, max_position_embeddings=64, seed=2), token_ids)
    assert not torch.allclose(logits[("lora", 1)], base_logits, atol=1e-3)  # the adapter matters
    return Lakes(lake, logits, token_ids)


@pytest.fixture(scope="module")
def lakes(tmp_path_factory: pytest.TempPathFactory) -> Lakes:
    work = tmp_path_factory.mktemp("export")
    return _write_lake(Lake.open(str(work / "lake")), work)


def _export(args: list[str]):
    return runner.invoke(app, ["export", *args])


def _loaded_logits(folder: Path, token_ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert not any("lora" in name for name, _ in model.named_parameters())
    return _logits(model, token_ids)


def test_export_writes_the_newest_checkpoint_as_an_hf_folder(lakes: Lakes, tmp_path: Path) -> None:
    result = _export(["full", str(tmp_path / "out"), "--lake", lakes.lake.uri])
    assert result.exit_code == 0, result.output
    assert "at step 2" in result.output  # step 5 has no CHECKPOINT.json: 2 is the newest
    names = {path.name for path in (tmp_path / "out").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(name.startswith(("optimizer", "rlpipe_checkpoint", "adapter")) for name in names)  # no trainer state
    assert torch.equal(_loaded_logits(tmp_path / "out", lakes.token_ids), lakes.logits[("full", 2)])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    assert tokenizer(PROMPT)["input_ids"] == lakes.token_ids


def test_export_of_an_older_step_into_an_empty_folder(lakes: Lakes, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = _export(["full", "--step", "0", str(tmp_path / "empty"), "--lake", lakes.lake.uri])
    assert result.exit_code == 0, result.output
    assert torch.equal(_loaded_logits(tmp_path / "empty", lakes.token_ids), lakes.logits[("full", 0)])


def test_export_of_a_lora_run_is_the_merged_model(lakes: Lakes, tmp_path: Path) -> None:
    result = _export(["lora", str(tmp_path / "merged"), "--lake", lakes.lake.uri])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    # plain transformers, no peft: the logits of base + adapter
    assert torch.allclose(_loaded_logits(tmp_path / "merged", lakes.token_ids), lakes.logits[("lora", 1)], atol=1e-5)


@pytest.mark.parametrize(("run_id", "extra", "error", "hint"), [
    ("nope", [], "no run 'nope' in", "rlpipe runs list"),
    ("full", ["--step", "1"], "run 'full' has no checkpoint at step 1", "checkpoints exist at steps 0, 2;"),
    ("fresh", [], "run 'fresh' in", "first checkpoint after the warm start"),
])
def test_bad_input_exits_2_without_traceback(lakes: Lakes, tmp_path: Path, run_id: str, extra: list[str], error: str, hint: str) -> None:
    result = _export([run_id, *extra, str(tmp_path / "out"), "--lake", lakes.lake.uri])
    assert result.exit_code == 2, result.output
    assert error in result.stderr and hint in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_folder_that_is_not_empty_is_refused_and_left_alone(lakes: Lakes, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    result = _export(["full", str(tmp_path / "taken"), "--lake", lakes.lake.uri])
    assert result.exit_code == 2, result.output
    assert "exists and is not empty" in result.stderr and "Traceback" not in result.output
    assert [path.name for path in (tmp_path / "taken").iterdir()] == ["notes.txt"]


def test_an_altered_newest_checkpoint_is_passed_over_unless_asked_for(tmp_path: Path) -> None:
    written = _write_lake(Lake.open(str(tmp_path / "lake")), tmp_path)
    weights = tmp_path / "lake" / "checkpoints" / "full" / "step=000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # the digest no longer matches
    result = _export(["full", str(tmp_path / "out"), "--lake", written.lake.uri])
    assert result.exit_code == 0, result.output
    assert "checkpoint at step 2 passed over" in result.stderr and "at step 0" in result.output
    assert torch.equal(_loaded_logits(tmp_path / "out", written.token_ids), written.logits[("full", 0)])
    asked = _export(["full", "--step", "2", str(tmp_path / "out2"), "--lake", written.lake.uri])
    assert asked.exit_code == 2 and "has xxh3_128" in asked.stderr and not (tmp_path / "out2").exists()


def test_export_from_s3_in_a_process_that_loads_no_model_library(tmp_path: Path, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real command in its own process, from a lake in S3 (moto over HTTP); the CLI
    copies files and imports neither torch nor transformers."""
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_ENDPOINT_URL", s3_endpoint)):
        monkeypatch.setenv(key, value)
    uri = f"s3://{unique_bucket('export')}/lake"
    s3_lake = _write_lake(Lake.open(uri), tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    code = ("import sys\nfrom rlpipe.cli.main import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit as exc:\n"
            "    print('exit', exc.code)\nprint(sorted(n for n in ('torch', 'transformers', 'peft', 'safetensors') if n in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code, "export", "full", str(tmp_path / "out"), "--lake", uri],
                            env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.stdout.strip().splitlines()[-2:] == ["exit 0", "[]"], result.stdout + result.stderr
    assert torch.equal(_loaded_logits(tmp_path / "out", s3_lake.token_ids), s3_lake.logits[("full", 2)])


def test_upload_policy_logs_the_hf_folder_to_mlflow(lakes: Lakes, tmp_path: Path) -> None:
    seed_mlflow_db(tmp_path / "mlflow.db")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "export-test")
    mlflow_run_id = tracker.start_run("full", tags={}, params={})
    assert upload_policy(tracker, lakes.lake, "full", mlflow_run_id, 2, timeout_s=60)
    client = MlflowClient(tracking_uri=tracker.uri)
    assert client.get_run(mlflow_run_id).data.tags["rlpipe.model_step"] == "2"
    folder = Path(client.download_artifacts(mlflow_run_id, MODEL_ARTIFACT, str(tmp_path / "download")))
    assert torch.equal(_loaded_logits(folder, lakes.token_ids), lakes.logits[("full", 2)])
    # the same policy as a logged model of the run (MLflow's "Logged models"), registered as version 1 of "full"
    [logged] = client.search_logged_models(experiment_ids=[tracker.experiment_id])
    assert (logged.name, logged.source_run_id, str(logged.status.value)) == ("full", mlflow_run_id, "READY")
    assert [output.model_id for output in client.get_run(mlflow_run_id).outputs.model_outputs] == [logged.model_id]
    version = client.get_model_version("full", "1")
    assert version.run_id == mlflow_run_id and version.source == logged.artifact_location
    tags = client.get_run(mlflow_run_id).data.tags
    assert (tags["rlpipe.logged_model_id"], tags["rlpipe.registered_model"]) == (logged.model_id, "full/1")
    # its pyfunc answers a prompt as plain transformers does with the exported folder: greedily
    model = mlflow.pyfunc.load_model(version.source)
    tokenizer, policy = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    ids = tokenizer(PROMPT, return_tensors="pt")
    expected = tokenizer.decode(policy.generate(**ids, max_new_tokens=4, do_sample=False)[0, ids["input_ids"].shape[1]:],
                                skip_special_tokens=True)
    assert model.predict([PROMPT], params={"max_new_tokens": 4}) == [expected]


def test_a_failed_upload_is_a_warning_and_returns(lakes: Lakes, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seed_mlflow_db(tmp_path / "mlflow.db")
    (tmp_path / "a-file").write_text("not a folder")  # the artifact store cannot make its folders below a file
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "broken", artifact_location=(tmp_path / "a-file").as_uri() + "/artifacts")
    mlflow_run_id = tracker.start_run("full", tags={}, params={})
    assert upload_policy(tracker, lakes.lake, "full", mlflow_run_id, 2, timeout_s=60) is False
    assert "could not log the final policy of run full" in caplog.text and "rlpipe export full DIR" in caplog.text
    assert "rlpipe.model_step" not in MlflowClient(tracking_uri=tracker.uri).get_run(mlflow_run_id).data.tags


def test_runs_show_prints_both_links_and_the_export_command(lakes: Lakes) -> None:
    lakes.lake.write_json("lora", "links.json", {
        "mlflow_tracking_uri": "http://127.0.0.1:5000", "mlflow_run_id": "m-lora",
        "mlflow_run_url": "http://127.0.0.1:5000/#/experiments/1/runs/m-lora",
        "prefect_flow_run_id": "p-lora", "prefect_flow_run_url": "http://127.0.0.1:4200/runs/flow-run/p-lora"})
    result = runner.invoke(app, ["runs", "show", "lora", "--lake", lakes.lake.uri])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "mlflow:  http://127.0.0.1:5000/#/experiments/1/runs/m-lora" in lines
    assert "prefect: http://127.0.0.1:4200/runs/flow-run/p-lora" in lines
    assert f"policy at step 1 (newest checkpoint); export it: rlpipe export lora DIR --lake {lakes.lake.uri}" in lines
    # a run without links.json (its flow run never started one): the ids from run.json
    shown = runner.invoke(app, ["runs", "show", "full", "--lake", lakes.lake.uri, "--json"])
    links = json.loads(shown.stdout)["links"]
    assert (links["mlflow_run_id"], links["prefect_flow_run_id"]) == ("m-full", "p-full")


def test_export_best_picks_the_best_evaluated_checkpoint_and_runs_show_lists_them(tmp_path: Path) -> None:
    written = _write_lake(Lake.open(str(tmp_path / "lake")), tmp_path)
    uri = written.lake.uri
    unscored = _export(["full", "--best", str(tmp_path / "none"), "--lake", uri])
    assert unscored.exit_code == 2 and "has a held-out evaluation" in unscored.stderr
    written.lake.write_json("full", "evals/before_rl.json", {"policy_version": 0, "accuracy": 0.75})
    written.lake.write_json("full", "evals/after_rl.json", {"policy_version": 2, "accuracy": 0.25})
    result = _export(["full", "--best", str(tmp_path / "best"), "--lake", uri])
    assert result.exit_code == 0, result.output
    assert "at step 0" in result.output  # not the newest (2): the best evaluated
    assert torch.equal(_loaded_logits(tmp_path / "best", written.token_ids), written.logits[("full", 0)])
    both = _export(["full", "--best", "--step", "2", str(tmp_path / "both"), "--lake", uri])
    assert both.exit_code == 2 and "--best and --step" in both.stderr
    shown = runner.invoke(app, ["runs", "show", "full", "--lake", uri, "--json"])
    assert shown.exit_code == 0, shown.output
    kept = json.loads(shown.stdout)["checkpoints"]
    assert [(c["step"], c["accuracy"], c["kept_as"]) for c in kept] == [(0, 0.75, ["last", "best"]), (2, 0.25, ["last"])]
    assert all(c["size_bytes"] > 0 for c in kept)
    assert all(c["write_s"] is not None and c["write_s"] >= 0 and c["write_cpu_s"] is not None and c["write_cpu_s"] >= 0
               for c in kept)  # what writing each took, from its CHECKPOINT.json
    table = runner.invoke(app, ["runs", "show", "full", "--lake", uri])
    assert "checkpoints kept" in table.stdout and "0.75" in table.stdout
