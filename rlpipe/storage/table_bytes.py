"""An Arrow table as the bytes of a file, and back.

- `parquet_bytes`: Parquet, zstd: what the lake keeps (committed parts, set-apart rows, eval
  trials, rescores, the verdict cache), small and read by any Parquet reader (DuckDB, Polars).
- `ipc_bytes` / `ipc_table`: the Arrow IPC file format, lz4: staged rows, read back only by
  rlpipe (a retried stage) and deleted once the step commits: no Parquet encoding on every
  step's path (docs/RESULTS.md has the times), for files a few times larger.

What it does not: write or read the files (storage/objects.py), check digests (storage/lake.py).
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_table(data: bytes) -> pa.Table:
    """The table of `ipc_bytes`; pyarrow.ArrowInvalid if `data` is not one."""
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()
