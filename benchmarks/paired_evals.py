"""Two held-out evaluations of one run compared task by task: the paired difference of their
success, its standard error, the tasks gained and lost (by family, where the run's config
says which family each held-out task is of) and an exact two-sided McNemar test.

  .venv/bin/python benchmarks/paired_evals.py LAKE RUN [--before before_rl.json]
      [--after after_rl.json] [--config configs/smollm2_agent.toml] [--set a.b=c ...]

LAKE is a local lake folder; the documents are LAKE/runs/RUN/evals/*.json as the run wrote
them (each task's outcome under `task/<task id>`). `--config`/`--set`: the run's config, to
draw its held-out tasks again and name each one's family (an env without families: none).

What it does not: read S3, evaluate anything, or compare evaluations of different held-out
sets (it refuses documents whose tasks differ).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASK_PREFIX = "task/"


def paired(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean paired difference of per-task outcomes, its standard error, tasks gained and
    lost, and the exact two-sided McNemar p value (a binomial test on the discordant tasks)."""
    if set(before) != set(after) or not before:
        raise ValueError("the two evaluations do not hold the same tasks: not one held-out set")
    diffs = [after[task] - before[task] for task in before]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else float("nan")
    gained = sum(after[task] > before[task] for task in before)
    lost = sum(after[task] < before[task] for task in before)
    discordant = gained + lost
    tail = sum(math.comb(discordant, k) for k in range(min(gained, lost) + 1))
    p = min(1.0, 2 * tail / 2 ** discordant) if discordant else 1.0
    return {"tasks": n, "difference": mean, "se": se, "gained": gained, "lost": lost, "mcnemar_p": p}


def task_outcomes(document: dict) -> dict[str, float]:
    return {key[len(TASK_PREFIX):]: float(value) for key, value in document.items() if key.startswith(TASK_PREFIX)}


def task_families(config_path: str, overrides: list[str]) -> dict[str, str]:
    from rlpipe.controller.evaluation import heldout_tasks
    from rlpipe.controller.sample import build_mixture
    from rlpipe.core.config import load_config

    config = load_config(config_path, overrides)
    mixture = build_mixture(config)
    families = {}
    for task in heldout_tasks(config, mixture):
        family = getattr(mixture.env_for(task), "task_family", None)
        if family is not None:
            families[task.task_id] = family(task)
    return families


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lake", type=Path)
    parser.add_argument("run")
    parser.add_argument("--before", default="before_rl.json")
    parser.add_argument("--after", default="after_rl.json")
    parser.add_argument("--config", help="the run's config, to name each task's family")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="a.b=c")
    args = parser.parse_args()
    folder = args.lake / "runs" / args.run / "evals"
    before, after = (task_outcomes(json.loads((folder / name).read_text())) for name in (args.before, args.after))
    result = paired(before, after)
    print(f"{result['tasks']} tasks: {args.before} {sum(before.values()) / len(before):.3f} -> {args.after} "
          f"{sum(after.values()) / len(after):.3f}; paired difference {100 * result['difference']:+.1f} points "
          f"(SE {100 * result['se']:.1f}); gained {result['gained']}, lost {result['lost']}; "
          f"exact McNemar p = {result['mcnemar_p']:.3g}")
    if args.config:
        families = task_families(args.config, args.overrides)
        gained = Counter(families.get(task, "?") for task in before if after[task] > before[task])
        lost = Counter(families.get(task, "?") for task in before if after[task] < before[task])
        print(f"gained by family {dict(gained)}; lost by family {dict(lost)}")


if __name__ == "__main__":
    main()
