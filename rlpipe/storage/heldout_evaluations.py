"""A run's held-out evaluations as stored in the lake (runs/<run>/evals/*.json, written by
tasks/lifecycle.py `evaluate`: before_rl, step_<N> every eval.every_steps, after_rl), read
back in the order they scored the policy, with each domain's strict and format-free
accuracy and its binomial standard error.

What it does not: run an evaluation (controller/evaluation.py) or rank checkpoints by it
(storage/checkpoint_retention.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pyarrow.fs as pafs

from rlpipe.storage.lake import Lake

_ORDER_OF_NAME = {"before_rl": 0, "after_rl": 2}  # at one policy version, before_rl first and after_rl last


@dataclass(frozen=True)
class DomainScore:
    """One domain in one evaluation: accuracies in [0, 1] (format_free None when the domain's
    answers are not numbers) and the tasks scored."""

    domain: str
    strict: float
    format_free: float | None
    count: int

    @property
    def strict_error(self) -> float:
        return binomial_standard_error(self.strict, self.count)

    @property
    def format_free_error(self) -> float | None:
        return None if self.format_free is None else binomial_standard_error(self.format_free, self.count)


@dataclass(frozen=True)
class HeldoutEvaluation:
    name: str  # before_rl, step_000008, after_rl
    policy_version: int  # the RL step whose policy was scored
    domains: tuple[DomainScore, ...]


def binomial_standard_error(accuracy: float, count: int) -> float:
    """sqrt(p (1 - p) / n): the standard error of an accuracy measured on n tasks."""
    return math.sqrt(accuracy * (1 - accuracy) / count) if count > 0 else float("nan")


def read_heldout_evaluations(lake: Lake, run_id: str, default_count: int) -> list[HeldoutEvaluation]:
    """The run's stored evaluations, by policy version (before_rl first, after_rl last at
    one version). `default_count` is the tasks per domain of a document that does not say
    (one written before `n/<domain>` was stored: envs.heldout_size)."""
    found: list[HeldoutEvaluation] = []
    for info in lake.objects.list(f"runs/{run_id}/evals"):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        data = lake.objects.get(f"runs/{run_id}/evals/{info.base_name}")
        try:
            document = json.loads(data.decode()) if data else None
            found.append(_evaluation(info.base_name.removesuffix(".json"), document, default_count))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # not an evaluation document
    return sorted(found, key=lambda e: (e.policy_version, _ORDER_OF_NAME.get(e.name, 1), e.name))


def _evaluation(name: str, document: dict, default_count: int) -> HeldoutEvaluation:
    version = int(document["policy_version"])
    domains = sorted(key.removeprefix("accuracy/") for key in document if key.startswith("accuracy/"))
    scores = tuple(
        DomainScore(domain, float(document[f"accuracy/{domain}"]),
                    float(document[f"format_free/{domain}"]) if f"format_free/{domain}" in document else None,
                    int(document.get(f"n/{domain}", default_count)))
        for domain in domains
    )
    return HeldoutEvaluation(name, version, scores)
