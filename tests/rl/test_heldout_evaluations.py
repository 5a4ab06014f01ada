"""Held-out evaluations: the held-out set is drawn with envs.heldout_seed, not the run's seed;
an evaluation's figures (strict and format-free per domain, the counts; per family and per
task where the env names families) and their MLflow names; the stored evaluations read back in order with binomial standard errors, as
`rlpipe runs show` prints them."""

import io
import math

from rich.console import Console

from rlpipe.cli.runs import evaluations_table
from rlpipe.controller.evaluation import EpisodeOutcome, accuracy_figures, family_figures, heldout_metrics, heldout_tasks
from rlpipe.controller.sample import build_mixture
from rlpipe.core.config import load_config
from rlpipe.storage.heldout_evaluations import binomial_standard_error, read_heldout_evaluations
from rlpipe.storage.lake import Lake

DOMAINS = "envs.domains={arithmetic = 0.5, reverse = 0.5}"


def _heldout_ids(*overrides: str) -> list[str]:
    config = load_config(None, [DOMAINS, "envs.heldout_size=20", *overrides])
    return [task.task_id for task in heldout_tasks(config, build_mixture(config))]


def test_two_run_seeds_get_the_same_heldout_tasks_and_the_heldout_seed_changes_them():
    assert _heldout_ids("seed=0") == _heldout_ids("seed=1")
    assert _heldout_ids("seed=0", "envs.heldout_seed=0") != _heldout_ids("seed=0", "envs.heldout_seed=1")


def test_figures_hold_strict_and_format_free_per_domain_and_the_counts():
    figures = accuracy_figures({"a": [1.0, 0.0, 0.0, 0.0], "words": [1.0, 1.0]}, {"a": [1.0, 1.0, 0.0, 0.0]})
    assert figures["accuracy"] == 0.5
    assert figures["accuracy/a"] == 0.25 and figures["format_free/a"] == 0.5
    assert figures["format_free"] == 0.5  # over the domains with numeric answers only
    assert "format_free/words" not in figures
    assert figures["n/a"] == 4 and figures["n/words"] == 2
    assert heldout_metrics(figures) == {
        "heldout/accuracy": 0.5, "heldout/a/accuracy": 0.25, "heldout/words/accuracy": 1.0,
        "heldout/format_free": 0.5, "heldout/a/format_free": 0.5,
    }


def test_episode_figures_per_family_and_per_task_beside_the_domains_own():
    outcomes = [EpisodeOutcome("agent_tasks", "sum", "agent_tasks/sum-a", True, 3, 3),
                EpisodeOutcome("agent_tasks", "sum", "agent_tasks/sum-b", False, 4, 2),
                EpisodeOutcome("agent_tasks", "sum", "agent_tasks/sum-c", False, 2, 2),
                EpisodeOutcome("agent_tasks", "lookup", "agent_tasks/port-d", True, 3, 3),
                EpisodeOutcome("agent_tasks", "lookup", "agent_tasks/port-d", False, 1, 0)]  # one task played twice
    figures = family_figures(outcomes)
    assert math.isclose(figures["family/agent_tasks/sum"], 1 / 3) and figures["family/agent_tasks/lookup"] == 0.5
    assert figures["n/agent_tasks/sum"] == 3 and figures["n/agent_tasks/lookup"] == 2
    assert figures["replies/agent_tasks/sum"] == 9 and math.isclose(figures["wellformed/agent_tasks/sum"], 7 / 9)
    assert figures["wellformed/agent_tasks/lookup"] == 0.75
    assert {key: value for key, value in figures.items() if key.startswith("task/")} == {
        "task/agent_tasks/sum-a": 1.0, "task/agent_tasks/sum-b": 0.0, "task/agent_tasks/sum-c": 0.0,
        "task/agent_tasks/port-d": 0.5}
    assert family_figures([]) == {}
    assert heldout_metrics(figures) == {  # a family's curve beside its domain's; counts and tasks not logged
        "heldout/agent_tasks/lookup/accuracy": 0.5, "heldout/agent_tasks/lookup/wellformed": 0.75,
        "heldout/agent_tasks/sum/accuracy": figures["family/agent_tasks/sum"],
        "heldout/agent_tasks/sum/wellformed": figures["wellformed/agent_tasks/sum"],
    }


def test_stored_evaluations_read_back_in_order_with_standard_errors(tmp_path):
    lake = Lake.open(str(tmp_path / "lake"))
    for name, version, strict in (("after_rl", 8, 0.5), ("step_000008", 8, 0.5), ("before_rl", 0, 0.1)):
        lake.write_json("r", f"evals/{name}.json", {"policy_version": version, "accuracy": strict, "accuracy/a": strict,
                                                    "format_free/a": strict + 0.2, "n/a": 100.0})
    lake.write_json("r", "evals/old.json", {"policy_version": 4, "accuracy": 0.3, "accuracy/a": 0.3,  # no counts: the default
                                            "family/a/f": 0.9, "n/a/f": 10.0, "task/a/t1": 1.0})  # not domains
    evaluations = read_heldout_evaluations(lake, "r", default_count=25)
    assert [(e.name, e.policy_version) for e in evaluations] == [("before_rl", 0), ("old", 4), ("step_000008", 8), ("after_rl", 8)]
    first = evaluations[0].domains[0]
    assert (first.strict, first.count) == (0.1, 100) and math.isclose(first.format_free, 0.3)
    assert math.isclose(first.strict_error, math.sqrt(0.1 * 0.9 / 100))
    [old] = evaluations[1].domains  # the family and task keys are not read as domains
    assert old.count == 25 and old.format_free is None and old.format_free_error is None
    assert binomial_standard_error(0.5, 0) != binomial_standard_error(0.5, 0)  # nan: no tasks, no error


def test_runs_show_prints_each_evaluation_with_its_errors():
    evaluations = [{"name": "before_rl", "step": 0, "domains": [
        {"domain": "rg_chain_sum", "count": 200, "strict": 0.1, "strict_error": 0.0212, "format_free": 0.25, "format_free_error": 0.0306},
        {"domain": "reverse", "count": 200, "strict": 0.5, "strict_error": 0.0354, "format_free": None, "format_free_error": None},
    ]}]
    output = io.StringIO()
    Console(file=output, width=200).print(evaluations_table(evaluations))
    lines = output.getvalue().splitlines()
    chain = next(line for line in lines if "rg_chain_sum" in line)
    assert "before_rl" in chain and "0.100 ± 0.021" in chain and "0.250 ± 0.031" in chain
    reverse = next(line for line in lines if "reverse" in line)
    assert "0.500 ± 0.035" in reverse and reverse.rstrip(" │").endswith("-")
