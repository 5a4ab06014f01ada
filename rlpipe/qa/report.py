"""The gate's report: markdown (report.md), a PNG histogram when difficulty ran
(difficulty.png), and the JSON of `QaReport.to_dict` (report.json), written to one folder.
For several envs at once (the gate before training): `write_gate_reports` writes each env's
report into a folder of its own, plus summary.md (every env's report) and checks.png (each
check's verifications and findings, per env).

What it does not: decide anything (the report states what checks.py and difficulty.py
found), or upload anywhere (MLflow and Prefect artifacts: tasks/quality_gate.py, or
`rlpipe qa --mlflow`).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpipe.qa.records import QaReport

MAX_FINDINGS_LISTED = 50


def markdown(report: QaReport) -> str:
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.findings)} findings)"
    lines = [f"# Quality gate: env `{report.env}`", "",
             f"Verdict: **{verdict}**. Verifier version `{report.verifier_version}`, {len(report.task_ids)} tasks.", "",
             "| check | result | verifications | findings | notes |", "|---|---|---|---|---|"]
    for check in report.checks:
        result = "skipped" if check.skipped else ("pass" if check.passed else "FAIL")
        lines.append(f"| {check.name} | {result} | {check.verifications} | {len(check.findings)} | "
                     f"{'; '.join(check.notes + ((check.skipped,) if check.skipped else ()))} |")
    if report.findings:
        lines += ["", "## Findings", "", "| check | task | answer | problem | reward | reason | detail |",
                  "|---|---|---|---|---|---|---|"]
        for finding in report.findings[:MAX_FINDINGS_LISTED]:
            detail = finding.detail.replace("|", "\\|").replace("\n", " ")[:120]
            lines.append(f"| {finding.check} | `{finding.task_id}` | {finding.answer} | {finding.problem} | "
                         f"{finding.reward} | {finding.reason} | {detail} |")
        if len(report.findings) > MAX_FINDINGS_LISTED:
            lines.append(f"\n... and {len(report.findings) - MAX_FINDINGS_LISTED} more (report.json has them all)")
    lines += ["", "## Difficulty", ""]
    if report.difficulty is None:
        lines.append(f"Skipped: {report.difficulty_skipped}")
    else:
        difficulty = report.difficulty
        lines += [f"Policy `{difficulty.policy}`: mean pass@1 {difficulty.mean_pass_at_1:.3f}, "
                  f"mean pass@{difficulty.k} {difficulty.mean_pass_at_k:.3f}.", "", "![pass@1 per task](difficulty.png)", "",
                  "| pass@1 | tasks |", "|---|---|"]
        lines += [f"| {label} | {count} |" for label, count in difficulty.histogram]
        lines += ["", f"| task | split | samples | correct | pass@1 | pass@{difficulty.k} |", "|---|---|---|---|---|---|"]
        lines += [f"| `{task.task_id}` | {task.split} | {task.samples} | {task.correct} | {task.pass_at_1:.3f} | "
                  f"{task.pass_at_k:.3f} |" for task in difficulty.tasks]
    return "\n".join(lines) + "\n"


def write_report(report: QaReport, folder: Path) -> list[Path]:
    """Write report.md, report.json and (with difficulty) difficulty.png into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "report.md", folder / "report.json"]
    written[0].write_text(markdown(report), encoding="utf-8")
    written[1].write_text(json.dumps(report.to_dict(), indent=2), encoding="utf-8")
    if report.difficulty is not None:
        written.append(_histogram_png(report, folder / "difficulty.png"))
    return written


def _histogram_png(report: QaReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    difficulty = report.difficulty
    assert difficulty is not None
    figure, axes = pyplot.subplots(figsize=(6, 3.5))
    labels = [label for label, _ in difficulty.histogram]
    axes.bar(labels, [count for _, count in difficulty.histogram], color="#4c72b0")
    axes.set_xlabel("pass@1 of the task")
    axes.set_ylabel("tasks")
    axes.set_title(f"{report.env}: {len(difficulty.tasks)} tasks, mean pass@{difficulty.k} {difficulty.mean_pass_at_k:.2f}")
    axes.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def summary_markdown(reports: list[QaReport], title: str, image: bool = True) -> str:
    """One markdown document of several envs' reports (each env's headings one level down);
    `image`: show checks.png from the same folder."""
    verdict = "PASSED" if all(report.passed for report in reports) else "FAILED"
    lines = [f"# {title}", "", f"Verdict: **{verdict}**.", ""] + (["![checks per env](checks.png)", ""] if image else [])
    for report in reports:
        lines += ["#" + line if line.startswith("#") else line for line in markdown(report).splitlines()]
        lines.append("")
    return "\n".join(lines)


def write_gate_reports(reports: list[QaReport], folder: Path, title: str) -> list[Path]:
    """Each env's report in folder/<env>/, then folder/summary.md and folder/checks.png."""
    written = [path for report in reports for path in write_report(report, folder / report.env)]
    summary = folder / "summary.md"
    summary.write_text(summary_markdown(reports, title), encoding="utf-8")
    return written + [summary, _checks_png(reports, folder / "checks.png")]


def _checks_png(reports: list[QaReport], path: Path) -> Path:
    """A bar per (env, check): its verifications; red with the finding count when it failed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    bars = [(f"{report.env}: {check.name}", check.verifications, len(check.findings)) for report in reports for check in report.checks]
    figure, axes = pyplot.subplots(figsize=(7, 0.4 * len(bars) + 1.2))
    labels = [label for label, _, _ in bars]
    axes.barh(labels, [count for _, count, _ in bars], color=["#c44e52" if findings else "#55a868" for _, _, findings in bars])
    for index, (_, count, findings) in enumerate(bars):
        axes.text(count, index, f" {findings} findings" if findings else " pass", va="center", fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("verifications")
    axes.set_title(f"quality gate: {sum(1 for report in reports if report.passed)} of {len(reports)} envs pass")
    axes.tick_params(axis="y", labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
