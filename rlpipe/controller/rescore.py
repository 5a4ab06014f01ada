"""Re-score a run's history: re-verify its committed trajectories with the CURRENT verifiers
into a new verdict table beside the old one, and say what flipped, by domain.

`rescore_run(lake, run_id, env=...)` is a plain function (no Prefect: `rlpipe rescore` calls
it, a flow can wrap it later). It reads every committed part of the run through its step
manifest (digests checked) in batches of BATCH_ROWS rows, verifies each batch and writes it
as a part, keeping counts and a few flip examples per domain, never the run's rows (what it
holds beyond a batch: one part's compressed bytes and a verdict per completion verified
now, for the verdict cache); it rebuilds the run's domains from its stored config with today's
code, and judges each completion again: exact domains inline, code on a sandbox pool of the
run's sandbox settings (controller/verify_batch.py, the verify stage's fan-out). A verifier that
raises gives an unscored crash verdict instead of stopping the rescore.

Verdicts are cached by (verifier version, task id, completion sha256): a completion already
judged by the current version (in its own trajectory row, in an earlier rescore, or earlier
in this one) is not run again. New verdicts go to the lake's verdict cache
(storage/verdict_cache.py). The table is written as runs/RUN/rescores/ID/part-*.parquet and
committed by its RESCORE.json, written last (storage/rescores.py); the run's own files are
only read.

What it does not: change a trajectory, a manifest or a reward the run trained on, or decide
what a flip means for the run (the caller prints the summary).
"""

from __future__ import annotations

import json
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from rlpipe.core.config import RunConfig, config_from_dict
from rlpipe.core.errors import ConfigError, RunNotFoundError, UserError
from rlpipe.core.records import Trajectory, Verdict, VerdictReason
from rlpipe.qa.gate import guarded_verify
from rlpipe.storage.lake import Lake
from rlpipe.storage.lake_records import PartRef
from rlpipe.storage.rescores import (
    FAIL_TO_PASS,
    PASS_TO_FAIL,
    DomainVerifier,
    RescoreManifest,
    RescoreRow,
    RescoreStore,
    completion_sha256,
    flip_of,
)
from rlpipe.controller.verify_batch import verify_batch
from rlpipe.storage.verdict_cache import CacheKey, VerdictCache

Progress = Callable[["RescoreProgress"], None]
EXAMPLE_TEXT_CHARS = 80
BATCH_ROWS = 4096
"""Rows read, verified and written at a time (the verify fan-out's batch)."""


@dataclass(frozen=True)
class RescoreProgress:
    """Where a rescore is: steps done of all, rows done, verdicts re-run and taken from the cache."""

    steps_done: int
    steps: int
    rows_done: int
    verified: int
    cached: int


@dataclass(frozen=True)
class FlipExample:
    """One verdict that flipped."""

    step: int
    task_id: str
    sample_idx: int
    completion: str  # the first EXAMPLE_TEXT_CHARS characters
    flip: str
    old_reason: str | None
    reason: str
    detail: str


@dataclass(frozen=True)
class DomainRescore:
    """What a rescore found in one domain."""

    domain: str
    rows: int
    stored_versions: tuple[str, ...]
    current_version: str
    pass_to_fail: int
    fail_to_pass: int
    unscored: int  # the current verifier could not score them (reward None)
    verified: int
    cached: int
    examples: tuple[FlipExample, ...]


@dataclass(frozen=True)
class RescoreSummary:
    """The outcome of one rescore; `to_dict` is `rlpipe rescore --json`."""

    rescore_id: str
    run_id: str
    lake_uri: str
    env: str | None
    rows: int
    verified: int
    cached: int
    domains: tuple[DomainRescore, ...]

    @property
    def flipped(self) -> int:
        return sum(domain.pass_to_fail + domain.fail_to_pass for domain in self.domains)

    def to_dict(self) -> dict:
        return {**asdict(self), "flipped": self.flipped}


def new_rescore_id() -> str:
    return f"rescore-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def run_config_of(lake: Lake, run_id: str) -> RunConfig:
    """The config run `run_id` was trained with (its run.json); RunNotFoundError if none."""
    info = lake.read_run_info(run_id)
    if info is None:
        raise RunNotFoundError(f"the lake {lake.uri} holds no run {run_id!r}",
                               hint="list runs with `rlpipe runs list`, or point --lake/--config at the lake that holds it")
    return config_from_dict(json.loads(info.config_json))


def rescore_run(lake: Lake, run_id: str, env: str | None = None, backend: str | None = None, use_cache: bool = True,
                progress: Progress | None = None, examples: int = 3, rescore_id: str | None = None,
                batch_rows: int = BATCH_ROWS) -> RescoreSummary:
    """Re-verify the committed trajectories of `run_id` (of domain `env` only, when given)
    with the current verifiers, `batch_rows` rows at a time (each batch verified, then
    written as a part); commit the new verdict table; return the summary."""
    from rlpipe.controller.launch import build_sandbox_pool  # mlflow comes with launch.py
    from rlpipe.controller.sample import build_mixture

    config = run_config_of(lake, run_id)
    domains = sorted(config.envs.domains)
    if env is not None and env not in domains:
        raise ConfigError(f"run {run_id!r} has no domain {env!r}",
                          f"its domains: {', '.join(domains)}; or leave out --env to rescore them all")
    wanted = [env] if env is not None else domains
    manifests = [m for m in lake.committed_manifests(run_id) if m.rows > 0]
    if not manifests:
        raise UserError(f"run {run_id!r} has no committed trajectories: nothing to rescore",
                        f"rescore a run with committed steps (see `rlpipe runs show {run_id}`)")
    sandbox = config.sandbox if backend is None else config.sandbox.model_copy(update={"backend": backend})
    selected = config.model_copy(update={"envs": config.envs.model_copy(update={"domains": {name: 1.0 for name in wanted}}),
                                         "sandbox": sandbox})
    mixture = build_mixture(selected)
    versions = {name: mixture.envs[name].verifier_version for name in wanted}
    cache = VerdictCache(lake)
    known = cache.load(versions.values()) if use_cache else {}
    fresh: dict[CacheKey, Verdict] = {}
    rescore_id = rescore_id or new_rescore_id()
    store = RescoreStore(lake)
    parts: list[PartRef] = []
    tallies: dict[str, DomainTally] = defaultdict(DomainTally)
    counts = {"rows": 0, "verified": 0, "cached": 0}
    pool = build_sandbox_pool(selected, mixture)
    try:
        for done, manifest in enumerate(manifests, start=1):
            written = 0  # parts of this step so far: a step's rows are written a batch a part
            for every in lake.iter_parts(manifest.parts + manifest.set_apart, batch_rows):
                unknown = sorted({row.task.domain for row in every} - set(domains))
                if unknown:
                    raise ConfigError(f"step {manifest.step} of run {run_id!r} holds rows of domains {unknown} that its config lacks",
                                      "the run's run.json and its trajectories disagree; rescore with --env DOMAIN")
                trajectories = [row for row in every if row.task.domain in versions]
                verdicts, cached = _judge(trajectories, versions, known, fresh, use_cache, mixture, pool, counts)
                rows = [_row(rescore_id, row, verdict, versions[row.task.domain], hit) for row, verdict, hit in
                        zip(trajectories, verdicts, cached)]
                if rows:
                    parts.append(store.write_part(run_id, rescore_id, manifest.step, rows, batch=written))
                    written += 1
                for row, trajectory in zip(rows, trajectories):
                    tallies[row.domain].add(row, trajectory, examples)
                counts["rows"] += len(rows)
            if progress is not None:
                progress(RescoreProgress(done, len(manifests), counts["rows"], counts["verified"], counts["cached"]))
    finally:
        if pool is not None:
            pool.close()  # type: ignore[attr-defined]
    if not counts["rows"]:
        raise UserError(f"run {run_id!r} holds no trajectories of domain {env!r}: nothing to rescore",
                        "pick a domain the run sampled (`rlpipe query \"select domain, count(*) from trajectories group by 1\"`)")
    cache.add(fresh)
    store.commit(RescoreManifest(
        rescore_id=rescore_id, run_id=run_id, env=env,
        verifiers=tuple(DomainVerifier(domain=name, rows=tallies[name].rows, stored_versions=tuple(sorted(tallies[name].stored_versions)),
                                       current_version=versions[name]) for name in sorted(tallies)),
        parts=tuple(parts), rows=counts["rows"], verified=counts["verified"], cached=counts["cached"],
        created_at_ms=int(time.time() * 1000)))
    return RescoreSummary(
        rescore_id=rescore_id, run_id=run_id, lake_uri=lake.uri, env=env, rows=counts["rows"],
        verified=counts["verified"], cached=counts["cached"],
        domains=tuple(tallies[name].summary(name, versions[name]) for name in sorted(tallies)))


@dataclass
class DomainTally:
    """What a rescore has seen of one domain so far: counts and the first flips, never the rows."""

    rows: int = 0
    pass_to_fail: int = 0
    fail_to_pass: int = 0
    unscored: int = 0
    verified: int = 0
    cached: int = 0
    stored_versions: set[str] = field(default_factory=set)
    examples: list[FlipExample] = field(default_factory=list)

    def add(self, row: RescoreRow, trajectory: Trajectory, examples: int) -> None:
        self.rows += 1
        self.pass_to_fail += row.flip == PASS_TO_FAIL
        self.fail_to_pass += row.flip == FAIL_TO_PASS
        self.unscored += row.reward is None
        self.verified += not row.cached
        self.cached += row.cached
        self.stored_versions.add(trajectory.verdict.verifier_version if trajectory.verdict else "")
        if row.flip is not None and sum(example.flip == row.flip for example in self.examples) < examples:
            self.examples.append(FlipExample(step=row.step, task_id=row.task_id, sample_idx=row.sample_idx,
                                             completion=trajectory.completion.text[:EXAMPLE_TEXT_CHARS], flip=row.flip,
                                             old_reason=row.old_reason, reason=row.reason, detail=row.detail[:120]))

    def summary(self, name: str, current: str) -> DomainRescore:
        return DomainRescore(domain=name, rows=self.rows, stored_versions=tuple(sorted(self.stored_versions)), current_version=current,
                             pass_to_fail=self.pass_to_fail, fail_to_pass=self.fail_to_pass, unscored=self.unscored,
                             verified=self.verified, cached=self.cached, examples=tuple(self.examples))


def _judge(trajectories: list[Trajectory], versions: dict[str, str], known: dict[CacheKey, Verdict],
           fresh: dict[CacheKey, Verdict], use_cache: bool, mixture, pool, counts: dict[str, int]) -> tuple[list[Verdict], list[bool]]:
    """The current verdict of each row, and whether it came from the cache; misses are
    verified in one batch (duplicates within it once)."""
    keys = [(versions[row.task.domain], row.task.task_id, completion_sha256(row.completion.text)) for row in trajectories]
    found: list[Verdict | None] = []
    for row, key in zip(trajectories, keys):
        hit = None
        if use_cache:
            old = row.verdict
            if old is not None and old.verifier_version == key[0] and old.reward is not None:
                hit = old  # judged by this very verifier version when the run committed it
            else:
                hit = known.get(key)
        found.append(hit if hit is not None else fresh.get(key))
    misses: dict[CacheKey, int] = {}
    for index, (key, verdict) in enumerate(zip(keys, found)):
        if verdict is None and key not in misses:
            misses[key] = index
    if misses:
        pairs = [(trajectories[index].task, trajectories[index].completion.text) for index in misses.values()]
        for key, verdict in zip(misses, verify_batch(mixture, pool, pairs, verify_one=guarded_verify)):
            fresh[key] = verdict
        counts["verified"] += len(misses)
    first_of_miss = set(misses.values())  # a repeat of a missed completion reuses its fresh verdict: not re-run
    cached = [index not in first_of_miss for index in range(len(trajectories))]
    counts["cached"] += sum(cached)
    return [verdict if verdict is not None else fresh[key] for verdict, key in zip(found, keys)], cached


def _row(rescore_id: str, trajectory: Trajectory, verdict: Verdict, version: str, cached: bool) -> RescoreRow:
    old = trajectory.verdict
    if verdict.verifier_version != version:  # a verifier that does not stamp its version: the env's is the truth
        verdict = replace(verdict, verifier_version=version)
    return RescoreRow(
        rescore_id=rescore_id, run_id=trajectory.run_id, step=trajectory.step, task_id=trajectory.task.task_id,
        domain=trajectory.task.domain, sample_idx=trajectory.completion.sample_idx,
        completion_sha256=completion_sha256(trajectory.completion.text),
        old_reward=old.reward if old else None, old_passed=old.passed if old else None,
        old_reason=VerdictReason(old.reason).value if old else None, old_verifier_version=old.verifier_version if old else None,
        reward=verdict.reward, passed=verdict.passed, reason=VerdictReason(verdict.reason).value, detail=verdict.detail,
        verify_duration_s=verdict.duration_s, verifier_version=version, cached=cached,
        flip=flip_of(old.passed if old else None, verdict.passed),
    )
