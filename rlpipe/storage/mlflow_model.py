"""A policy folder as an MLflow logged model, registered in MLflow's model registry.

What it does: `log_policy_model` saves a Hugging Face folder (the final policy,
workers/policy_export.py) as an MLflow pyfunc model: the folder whole as the model's
artifact `policy` (plain transformers loads it) and `PolicyModel`, whose predict answers a
list of prompts with greedy completions; then uploads it as a logged model of the run's
experiment whose source run is the MLflow run (MLflow's "Logged models" list;
`mlflow.pyfunc.load_model("models:/<model id>")` loads it where rlpipe is installed), and
registers it as a new version of the registered model `name`. Nothing is loaded to save it,
and the pip requirements are named, not inferred (inferring loads the model in a subprocess).
Why not `mlflow.transformers`: its save from a local folder fails with transformers 5 (it
reads the pipeline class from a task registry that now holds class names).

Through an `MlflowClient` only (no fluent global run), like storage/tracking.py, which calls
it and translates MLflow's errors. What it does not: export the folder (workers/), decide
whether to log (orchestration/track.py), or retry.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from importlib.metadata import version as installed_version

from mlflow import MlflowClient
from mlflow.entities import LoggedModelOutput
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModel, PythonModelContext

POLICY_ARTIFACT = "policy"
MAX_NEW_TOKENS = 64
"""predict's default completion length (params={"max_new_tokens": N} changes it)."""


class PolicyModel(PythonModel):
    """The policy as a pyfunc model: predict(list of prompts) -> their greedy completions."""

    def load_context(self, context: PythonModelContext) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = context.artifacts[POLICY_ARTIFACT]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder).eval()

    def predict(self, context, model_input, params=None):  # noqa: ANN001 - hints here would replace the signature with one without params
        """Greedy completions of the prompts in `model_input` (strings), at most
        params["max_new_tokens"] new tokens each."""
        import torch

        column = model_input.iloc[:, 0] if hasattr(model_input, "iloc") else model_input  # MLflow passes a DataFrame
        prompts = [str(prompt) for prompt in column]
        max_new_tokens = int((params or {}).get("max_new_tokens", MAX_NEW_TOKENS))
        completions = []
        with torch.no_grad():
            for prompt in prompts:
                ids = self.tokenizer(prompt, return_tensors="pt")
                out = self.model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
                completions.append(self.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
        return completions


@dataclass(frozen=True)
class LoggedPolicy:
    """The logged model's id and the registered model version it became."""

    model_id: str
    registered_name: str
    version: str


def log_policy_model(client: MlflowClient, experiment_id: str, mlflow_run_id: str, folder: Path, name: str,
                     step: int) -> LoggedPolicy:
    """Log the HF folder `folder` as a logged model named `name` of MLflow run `mlflow_run_id`
    (an output of the run at `step`) and register it as a version of `name`."""
    import mlflow.pyfunc
    from mlflow.models import infer_signature

    signature = infer_signature(["a prompt"], ["its completion"], params={"max_new_tokens": MAX_NEW_TOKENS})
    requirements = [f"{name}=={installed_version(name)}" for name in ("rlpipe", "torch", "transformers", "tokenizers", "safetensors")]
    with tempfile.TemporaryDirectory(prefix="rlpipe-mlflow-model-") as scratch:
        flavored = Path(scratch) / "policy-model"
        mlflow.pyfunc.save_model(str(flavored), python_model=PolicyModel(), artifacts={POLICY_ARTIFACT: str(folder)},
                                 pip_requirements=requirements, signature=signature)
        model = client.create_logged_model(experiment_id, name=name, source_run_id=mlflow_run_id,
                                           tags={"rlpipe.policy_step": str(step)}, model_type="policy")
        try:
            client.log_model_artifacts(model.model_id, str(flavored))
        except BaseException:
            client.finalize_logged_model(model.model_id, "FAILED")
            raise
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(mlflow_run_id, [LoggedModelOutput(model.model_id, step)])
    try:
        client.create_registered_model(name, description=f"the policies of rlpipe run {name}")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    # the artifact location, not models:/<id>: MLflow's sqlite registry resolves that URI
    # through the process's default tracking URI, not this client's
    version = client.create_model_version(name, source=model.artifact_location, run_id=mlflow_run_id,
                                          model_id=model.model_id)
    return LoggedPolicy(model_id=model.model_id, registered_name=name, version=str(version.version))
