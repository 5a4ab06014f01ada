"""The train flow's parameters are typed: Prefect's parameter schema is a form of the
RunConfig tables (defaults and docs from the pydantic models), a deployment run with a
partial config is accepted by the server and validates into a RunConfig, a config file on
the worker merges under the form's values as under `--set` (flows/run_parameters.py), the
served form names the quickstart's file, and an empty run id
becomes a new id per flow run (stable across retries of one flow run).

No run is trained here: the schema, the server's validation and the merge rule are what is
checked (the served end-to-end run is tests/cli/test_up_serves_train.py)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.exceptions import PrefectHTTPStatusError
from prefect.utilities.callables import parameter_schema

from rlpipe.core.config import RunConfig, load_config
from rlpipe.core.errors import ConfigError
from rlpipe.flows.run_parameters import QUICKSTART_CONFIG, derive_run_id, resolve_config
from rlpipe.flows.serve import served_deployments
from rlpipe.flows.train import train
from tests.cli.cli_process import REPO_ROOT


def test_parameter_schema_is_a_form_of_the_run_config_tables() -> None:
    schema = parameter_schema(train.fn).model_dump()
    assert train.parameters.model_dump() == schema  # what the deployment registers
    properties, definitions = schema["properties"], schema["definitions"]
    assert list(properties) == ["config", "run_id", "config_path", "crash_retries"]
    assert properties["config"]["$ref"] == "#/definitions/RunConfig"
    assert properties["run_id"]["default"] == "" and "new id per flow run" in properties["run_id"]["description"]
    assert "TOML" in properties["config_path"]["description"]
    assert schema.get("required", []) == []  # a run starts with the form as it is drawn
    run_config = definitions["RunConfig"]["properties"]
    for table in ("model", "envs", "rollout", "algo", "train", "storage", "tracking", "checkpoint", "sandbox"):
        assert table in run_config, table
    steps = definitions["TrainConfig"]["properties"]["steps"]
    assert steps["type"] == "integer" and steps["default"] == RunConfig().train.steps and steps["description"]
    assert definitions["TrainConfig"]["additionalProperties"] is False  # unknown keys are refused
    storage = definitions["StorageConfig"]["properties"]
    assert "lake_uri" in storage and "s3_access_key" not in storage and "s3_secret_key" not in storage  # no secrets in a form


def test_a_deployment_run_with_a_partial_config_validates(prefect_api_url: str) -> None:
    parameters = {"config": {"train": {"steps": 3}, "rollout": {"group_size": 4}}, "run_id": "partial"}
    accepted, refused = asyncio.run(_deployment_runs(parameters, {"config": {"train": {"stepz": 3}}}))
    assert accepted == parameters  # stored as sent: the worker validates it into a RunConfig
    validated = train.validate_parameters(accepted)
    config = validated["config"]
    assert isinstance(config, RunConfig)
    assert (config.train.steps, config.rollout.group_size) == (3, 4)
    assert config.rollout.prompts_per_step == RunConfig().rollout.prompts_per_step  # the rest: defaults
    assert refused == 409, "the server checks parameters against the schema (enforce_parameter_schema)"


async def _deployment_runs(good: dict, bad: dict) -> tuple[dict, int]:
    deployment = await train.ato_deployment(name=f"params-{uuid.uuid4().hex[:6]}")
    deployment_id = await deployment.aapply()
    async with get_client() as client:
        flow_run = await client.create_flow_run_from_deployment(deployment_id, parameters=good)
        try:
            await client.create_flow_run_from_deployment(deployment_id, parameters=bad)
        except PrefectHTTPStatusError as exc:
            status = exc.response.status_code
        else:
            status = 200
        await client.delete_flow_run(flow_run.id)  # nothing serves it: leave no scheduled run behind
    return flow_run.parameters, status


def test_file_is_the_base_and_the_form_changes_go_on_top(tmp_path: Path) -> None:
    path = tmp_path / "nightly.toml"
    path.write_text('[train]\nsteps = 7\n[rollout]\ngroup_size = 4\n')
    form = RunConfig.model_validate({"rollout": {"prompts_per_step": 2}, "train": {"steps": 7}})
    config = resolve_config(form, str(path))
    # file: steps 7, group 4; form: prompts 2 (steps 7 agrees with the file)
    assert (config.train.steps, config.rollout.group_size, config.rollout.prompts_per_step) == (7, 4, 2)
    assert resolve_config(RunConfig(), str(path)).rollout.prompts_per_step == RunConfig().rollout.prompts_per_step


def test_the_form_merges_over_the_file_as_set_does(tmp_path: Path) -> None:
    """The form's values that differ from the defaults win over the file's, key by key,
    exactly as `--set` does on the command line (core/config.py merge_config)."""
    path = tmp_path / "quick.toml"
    path.write_text('[train]\nsteps = 120\nlr = 5e-4\n[envs]\ndomains = { reverse = 1.0 }\n[rollout]\ngroup_size = 8\n')
    form = RunConfig.model_validate({"train": {"steps": 5}, "envs": {"domains": {"arithmetic": 0.5, "reverse": 0.5}},
                                     "rollout": {"prompts_per_step": 2}})
    from_the_form = resolve_config(form, str(path))
    with_set = load_config(path, ["train.steps=5", "envs.domains={arithmetic = 0.5, reverse = 0.5}",
                                  "rollout.prompts_per_step=2"])
    assert from_the_form == with_set
    assert (from_the_form.train.steps, from_the_form.train.lr, from_the_form.rollout.group_size) == (5, 5e-4, 8)
    assert from_the_form.envs.domains == {"arithmetic": 0.5, "reverse": 0.5}  # a table-valued key is replaced whole


def test_without_a_file_the_form_is_the_config() -> None:
    form = RunConfig.model_validate({"seed": 3, "train": {"steps": 5}, "envs": {"reasoning_gym": {"legs": {"dataset": "leg_counting", "heldout_fraction": 0.3}}},
                                     "storage": {"s3_access_key": "key", "s3_secret_key": "secret"}})
    resolved = resolve_config(form, None)
    assert resolved == form
    assert (resolved.storage.s3_access_key, resolved.storage.s3_secret_key) == ("key", "secret")  # never dumped, kept


def test_the_served_form_defaults_to_the_quickstart() -> None:
    """Run as drawn trains the quickstart (minutes), not the defaults' 300-step warm start."""
    train_deployment = next(deployment for deployment in served_deployments() if deployment.name == "train")
    assert train_deployment.parameters == {"config_path": str(QUICKSTART_CONFIG)}
    assert resolve_config(RunConfig(), str(QUICKSTART_CONFIG)) == load_config(REPO_ROOT / "configs" / "quickstart.toml")
    assert "--set" in train_deployment.description and "quickstart" in train_deployment.description


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        resolve_config(RunConfig(), str(tmp_path / "missing.toml"))


def test_cross_table_checks_apply_to_the_form() -> None:
    form = RunConfig.model_validate({"curriculum": {"band": [0.9, 0.1]}})  # each table alone is valid
    with pytest.raises(ConfigError, match="curriculum.band"):
        resolve_config(form, None)


def test_an_empty_run_id_is_new_per_flow_run_and_stable_across_its_retries() -> None:
    night_1 = datetime(2026, 12, 3, 3, 0, tzinfo=timezone.utc)
    night_2 = datetime(2026, 12, 4, 3, 0, tzinfo=timezone.utc)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    assert derive_run_id(first, night_1, None) == derive_run_id(first, night_1, None)  # a retry: same id, resumes
    assert derive_run_id(first, night_1, None) != derive_run_id(second, night_2, None)  # the next night: a new run
    assert derive_run_id(first, night_1, "configs/quickstart.toml") == f"quickstart-20261203-030000-{first.replace('-', '')[:8]}"
