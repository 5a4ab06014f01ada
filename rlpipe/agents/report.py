"""The report of an eval: flat metrics for a tracker, a markdown page, and PNG plots.

- `flat_metrics(metrics)`: the numbers of agents/metrics.py under MLflow-style keys:
  every number as it is (success_rate, steps_p90, well_formed_rate, ...), the verdict
  counts as `verdict/<verdict>`, the failure modes as `failure/<family>/<verdict>`, and
  the success rate of each task kind as `kind/<kind>/success_rate` (scored trials of that
  kind only; a kind with nothing scored has no key).
- `report_markdown(...)`: one page: summary, steps and duration (mean p50 p90), tool-call
  accuracy, failure modes by family, a table by task kind, one row per task, the plots.
- `report_plots(...)`: `verdicts_by_kind.png` (stacked bars: the final verdict of each task,
  by task kind) and `steps_histogram.png` (agent replies per scored trial). Drawn on
  matplotlib's Agg canvas (no pyplot state: safe from threads).

Task kinds come from each task's `[metadata] category` ("" -> "uncategorised").

What it does not do: run trials, or log anywhere (rlpipe/controller/eval_tracking.py sends
these to MLflow).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlpipe.agents.records import TrialResult, TrialVerdict

UNCATEGORISED = "uncategorised"
PLOT_FILES = ("verdicts_by_kind.png", "steps_histogram.png")
DETAIL_CHARS = 80


def kind_of(task_id: str, kinds: Mapping[str, str]) -> str:
    return kinds.get(task_id) or UNCATEGORISED


def flat_metrics(metrics: Mapping[str, object], trials: Sequence[TrialResult] = (),
                 kinds: Mapping[str, str] | None = None) -> dict[str, float]:
    """Every number of `metrics` under a flat key (see the module docstring)."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
            continue
        if key == "verdicts":
            flat.update({f"verdict/{name}": float(count) for name, count in value.items()})
        elif key == "failure_modes":
            for family, counts in value.items():
                flat.update({f"failure/{family}/{name}": float(count) for name, count in counts.items()})
        elif not isinstance(value, dict):
            flat[key] = float(value)
    for kind, (scored, passed) in _kind_scores(trials, kinds or {}).items():
        if scored:
            flat[f"kind/{kind}/success_rate"] = passed / scored
    return flat


def _kind_scores(trials: Sequence[TrialResult], kinds: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """kind -> (scored trials, passed trials)."""
    scores: dict[str, tuple[int, int]] = {}
    for trial in trials:
        scored, passed = scores.get(kind_of(trial.task_id, kinds), (0, 0))
        if trial.verdict.family == "agent":
            scored, passed = scored + 1, passed + trial.passed
        scores[kind_of(trial.task_id, kinds)] = (scored, passed)
    return dict(sorted(scores.items()))


def report_markdown(title: str, metrics: Mapping[str, object], trials: Sequence[TrialResult], kinds: Mapping[str, str],
                    attempts: Mapping[str, int], facts: Sequence[tuple[str, str]] = ()) -> str:
    """The eval's report page; `facts` are (label, value) lines under the title (agent, lake, ...)."""
    m = metrics
    lines = [f"# {title}", ""]
    lines += [f"- {label}: `{value}`" for label, value in facts]
    lines += ["", "## Summary", "",
              f"success rate **{m['success_rate']:.3f}** ({m['passed']} of {m['scored']} scored trials passed); "
              f"{m['trials']} tasks, {m['infrastructure_failures']} infrastructure failures, {m['not_run']} not run, "
              f"{m['attempts']} attempts ({m['infrastructure_retries']} infrastructure retries).", "",
              "## Steps and duration (scored trials)", "", "| | mean | p50 | p90 |", "|---|---|---|---|",
              f"| steps | {m['steps_mean']:.2f} | {m['steps_p50']:.2f} | {m['steps_p90']:.2f} |",
              f"| duration (s) | {m['duration_s_mean']:.2f} | {m['duration_s_p50']:.2f} | {m['duration_s_p90']:.2f} |", "",
              "## Tool calls (scored trials)", "", "| | value |", "|---|---|",
              f"| replies | {m['replies']} |", f"| well formed | {m['well_formed_rate']:.3f} |",
              f"| known tool | {m['known_tool_rate']:.3f} |", f"| valid arguments | {m['valid_arguments_rate']:.3f} |",
              f"| valid calls / malformed | {m['tool_calls']} / {m['malformed_calls']} |",
              f"| bash exit 0 | {m['bash_exit_zero_rate']:.3f} of {m['bash_calls']} |", f"| tool errors | {m['tool_errors']} |", "",
              "## Failure modes", "", "| family | verdict | trials |", "|---|---|---|"]
    failures = m["failure_modes"]
    rows = [(family, name, count) for family in ("agent", "infrastructure") for name, count in failures.get(family, {}).items()]
    lines += [f"| {family} | {name} | {count} |" for family, name, count in rows] or ["| - | none | 0 |"]
    lines += ["", "Infrastructure failures are never scored as the agent's.", "", "## By task kind", "",
              "| kind | tasks | scored | passed | success rate |", "|---|---|---|---|---|"]
    tasks_per_kind = Counter(kind_of(trial.task_id, kinds) for trial in trials)
    for kind, (scored, passed) in _kind_scores(trials, kinds).items():
        rate = f"{passed / scored:.3f}" if scored else "-"
        lines.append(f"| {kind} | {tasks_per_kind[kind]} | {scored} | {passed} | {rate} |")
    lines += ["", "## Trials (the final attempt of each task)", "",
              "| task | kind | verdict | reward | steps | attempts | s | detail |", "|---|---|---|---|---|---|---|---|"]
    for trial in trials:
        reward = "" if trial.reward is None else f"{trial.reward:g}"
        lines.append(f"| {trial.task_id} | {kind_of(trial.task_id, kinds)} | {trial.verdict.value} | {reward} | {len(trial.steps)} "
                     f"| {attempts.get(trial.task_id, 1)} | {trial.duration_s:.2f} | {_cell(trial.detail)} |")
    lines += ["", "## Plots", ""] + [f"![{name}](plots/{name})" for name in PLOT_FILES]
    return "\n".join(lines) + "\n"


def _cell(detail: str) -> str:
    last = detail.strip().splitlines()[-1] if detail.strip() else ""
    last = last if len(last) <= DETAIL_CHARS else last[:DETAIL_CHARS - 3] + "..."
    return last.replace("|", "\\|").replace("`", "'")


def report_plots(trials: Sequence[TrialResult], kinds: Mapping[str, str]) -> dict[str, bytes]:
    """file name -> PNG bytes, for PLOT_FILES."""
    return {"verdicts_by_kind.png": _verdicts_by_kind(trials, kinds), "steps_histogram.png": _steps_histogram(trials)}


def _verdicts_by_kind(trials: Sequence[TrialResult], kinds: Mapping[str, str]) -> bytes:
    names = sorted({kind_of(trial.task_id, kinds) for trial in trials}) or [UNCATEGORISED]
    counts = Counter((kind_of(trial.task_id, kinds), trial.verdict) for trial in trials)
    figure = Figure(figsize=(8, 4.5), dpi=100)
    axes = figure.add_subplot()
    bottoms = [0] * len(names)
    for verdict in TrialVerdict:
        heights = [counts[(name, verdict)] for name in names]
        if any(heights):
            axes.bar(names, heights, bottom=bottoms, label=verdict.value)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("tasks")
    axes.set_title("final verdict by task kind")
    axes.tick_params(axis="x", labelrotation=30)
    if trials:
        axes.legend(fontsize="small")
    figure.tight_layout()
    return _png(figure)


def _steps_histogram(trials: Sequence[TrialResult]) -> bytes:
    steps = [len(trial.steps) for trial in trials if trial.verdict.family == "agent"]
    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.add_subplot()
    if steps:
        axes.hist(steps, bins=range(min(steps), max(steps) + 2), align="left", rwidth=0.8)
    axes.set_xlabel("agent replies (steps)")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("scored trials")
    axes.set_title("steps per scored trial")
    figure.tight_layout()
    return _png(figure)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
