"""The verdict cache: what a verifier version said of a completion of a task, kept in the lake.

Layout under the lake root:

    verdicts/verifier={version_key}/part-{digest}.parquet   VERDICT_CACHE_SCHEMA, content-addressed

Keyed by (verifier version, task id, sha256 of the completion text): a verifier version
hashes the verifier's source and parameters (envs/exact.py `source_version`), so the same
key gets the same judgement, and a re-score skips it. Parts are immutable and named by a
digest of their bytes, so writing the same entries twice is harmless and a part is whole or
absent (each is one atomic put): no manifest is needed. Only scored verdicts are stored (a
reward of None, a sandbox that failed, is not a judgement of the completion). `version_key`
is the version itself when it is a plain name, else `h-` + a digest of it.

What it does not: evict anything, or verify (rlpipe/controller/rescore.py fills and reads it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rlpipe.core.errors import LakeCorrupted
from rlpipe.core.records import Verdict, VerdictReason
from rlpipe.storage.lake import Lake
from rlpipe.storage.table_bytes import parquet_bytes

VERDICT_CACHE_SCHEMA = pa.schema(
    [
        pa.field("verifier_version", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("completion_sha256", pa.string(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("passed", pa.bool_(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("verify_duration_s", pa.float64(), nullable=False),
    ]
)

CacheKey = tuple[str, str, str]  # (verifier version, task id, completion sha256)
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def version_key(verifier_version: str) -> str:
    """The folder name of a verifier version's entries."""
    if _PLAIN.match(verifier_version):
        return verifier_version
    return "h-" + hashlib.sha256(verifier_version.encode()).hexdigest()[:16]


class VerdictCache:
    """Reads and adds verdict cache entries of one lake."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.objects = lake.objects

    def load(self, versions: Iterable[str]) -> dict[CacheKey, Verdict]:
        """Every stored entry of these verifier versions."""
        entries: dict[CacheKey, Verdict] = {}
        for version in sorted(set(versions)):
            folder = f"verdicts/verifier={version_key(version)}"
            for info in self.objects.list(folder):
                if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                    continue
                relative = f"{folder}/{info.base_name}"
                data = self.objects.get(relative)
                if data is None:
                    continue  # listed, then gone: another process's cleanup; a miss is only slower
                digest = hashlib.sha256(data).hexdigest()[:16]
                if info.base_name != f"part-{digest}.parquet":
                    raise LakeCorrupted(f"lake {self.lake.uri}: verdict cache part {relative} does not match its digest {digest}",
                                        hint="delete it: the verdicts it held are re-run by the next rescore")
                for row in pq.read_table(pa.BufferReader(data)).to_pylist():
                    if row["verifier_version"] != version:
                        continue  # two versions that share a hashed folder name
                    entries[(version, row["task_id"], row["completion_sha256"])] = Verdict(
                        reward=row["reward"], passed=row["passed"], reason=VerdictReason(row["reason"]),
                        detail=row["detail"], duration_s=row["verify_duration_s"], verifier_version=version)
        return entries

    def add(self, entries: dict[CacheKey, Verdict]) -> list[str]:
        """Store the scored entries, one part per verifier version; returns the parts' paths."""
        by_version: dict[str, list[tuple[CacheKey, Verdict]]] = {}
        for key, verdict in sorted(entries.items()):
            if verdict.reward is not None:
                by_version.setdefault(key[0], []).append((key, verdict))
        written = []
        for version, items in by_version.items():
            table = pa.table({
                "verifier_version": [version] * len(items),
                "task_id": [key[1] for key, _ in items],
                "completion_sha256": [key[2] for key, _ in items],
                "reward": [verdict.reward for _, verdict in items],
                "passed": [verdict.passed for _, verdict in items],
                "reason": [VerdictReason(verdict.reason).value for _, verdict in items],
                "detail": [verdict.detail for _, verdict in items],
                "verify_duration_s": [verdict.duration_s for _, verdict in items],
            }, schema=VERDICT_CACHE_SCHEMA)
            data = parquet_bytes(table)
            relative = f"verdicts/verifier={version_key(version)}/part-{hashlib.sha256(data).hexdigest()[:16]}.parquet"
            self.objects.put(relative, data)
            written.append(relative)
        return written
