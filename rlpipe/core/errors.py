"""The error tree of rlpipe.

    RlpipeError                      base of everything rlpipe raises on purpose
    ├── UserError                    bad input; the CLI prints it (no traceback) and exits 2
    │   ├── ConfigError              a config key, value or file is wrong
    │   ├── DatasetError             a dataset or a task cannot be read
    │   ├── ModelNotFoundError       a model folder is missing or incomplete
    │   ├── RunNotFoundError         a run id that the lake does not hold
    │   └── LakeNotFoundError        no lake at the URI (read-only commands never create one)
    ├── LakeCorrupted                a committed file is missing or altered; never retried
    ├── DiskFull                     the disk that holds the lake is full (ENOSPC); never retried
    ├── AgentStateError              what the sandboxed agent left cannot be copied (too big, unreadable):
    │                                the agent's failure (reward 0), never retried as infrastructure
    └── InfraError                   the machinery failed; Prefect retries these (with backoff)
        ├── StorageUnavailable       the lake (S3 endpoint, disk) cannot be reached
        ├── SandboxUnavailable       a sandbox backend (bwrap, docker daemon) is gone
        ├── ClusterUnavailable       the Ray cluster that verifies is unreachable, or an actor of it died
        ├── EngineFailed             the rollout engine died
        └── TrainerGroupFailed       a rank of the trainer's torchrun group died or timed out

A wrong answer, a timeout or an OOM inside a sandbox is not an error: it is a Verdict.
Third-party exceptions are translated at the adapter that sees them (`raise X(...) from exc`).
Every error carries `hint`: what the user can do about it.
"""

from __future__ import annotations


class RlpipeError(Exception):
    """Base of every error rlpipe raises on purpose."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class UserError(RlpipeError):
    """Bad input from the user: never retried, shown without a traceback, exit code 2."""


class ConfigError(UserError):
    """A config file, key or value is wrong."""


class DatasetError(UserError):
    """A dataset or task file cannot be read or is malformed."""


class ModelNotFoundError(UserError):
    """A model folder is missing or lacks config/weights/tokenizer."""


class RunNotFoundError(UserError):
    """The lake holds no run with this id."""


class LakeNotFoundError(UserError):
    """Nothing is stored at the lake URI: no folder, no bucket (or nothing under its prefix)."""


class LakeCorrupted(RlpipeError):
    """A file the lake committed (a part, a checkpoint file) is missing, fails its digest, or
    holds what rlpipe never writes (a checkpoint pickle that would run code).

    Not an InfraError: a retry reads the same bytes. The run stops with this error; the
    hint says what to restore or delete.
    """


class DiskFull(RlpipeError):
    """The disk that holds the lake (or a quota on it) has no room left for a write (ENOSPC,
    EDQUOT). Not an InfraError: a retry meets the same full disk. The run stops with this
    error (exit 2); what was committed stays, and `rlpipe resume` goes on once space is free."""


class AgentStateError(RlpipeError):
    """The sandboxed code's own files make a sandbox operation refuse: a snapshot or restore
    whose tree holds more data than the sandbox's disk limit (`Limits.disk_mb`), or a tree
    the snapshot cannot read because of what the code did to it.

    Not an InfraError: a retry meets the same files. A trial that gets it is the agent's
    failure (reward 0), recorded with this message; the host and the backend are fine.
    """


class InfraError(RlpipeError):
    """The machinery failed (not the data): retried by Prefect with backoff and jitter."""


class StorageUnavailable(InfraError):
    """The lake cannot be reached (S3 endpoint down, disk error)."""


class SandboxUnavailable(InfraError):
    """A sandbox backend cannot be used (bwrap missing, docker daemon gone)."""


class ClusterUnavailable(InfraError):
    """The Ray cluster of cluster.ray_address cannot be reached, or a verifier actor on it
    died or stopped answering: no verdict of that batch is kept, the stage is retried."""


class EngineFailed(InfraError):
    """The rollout engine died or stopped answering."""


class TrainerGroupFailed(InfraError):
    """A rank of the trainer's torchrun group (cluster.trainer_nproc > 1) died, failed in a
    collective (a peer gone, cluster.trainer_timeout_s passed), or the group did not start:
    the trainer worker exits, the stage is retried, and a fresh worker restores from the lake."""
