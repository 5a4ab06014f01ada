"""`rlpipe query`'s output, streamed: rows are printed as DuckDB hands them over in Arrow
record batches (storage/query.py `stream_query`), at most `limit` of them, so a result of
any size prints in bounded memory.

Text: pages of up to PAGE_ROWS rows, each a table (header repeated), or, when the first
page's columns do not fit the terminal, one record per row (every name and value whole).
JSON (`--json`): one array of objects, written an object at a time, exactly what
`json.dumps(rows, indent=2)` writes. When the limit cut the result short, a line says so
(on stderr with --json, so stdout stays one JSON document).

Not here: the SQL, its views or its errors (storage/query.py).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from rich.console import Console
from rich.table import Table

from rlpipe.storage.lake import Lake
from rlpipe.storage.query import rows_of, stream_query

DEFAULT_LIMIT = 1000
PAGE_ROWS = 500
CELL_CHARS = 24  # a cell wider than this wraps in a table: it does not widen the table
BATCH_ROWS = 1024


@dataclass
class _Limited:
    """The rows of the batches, at most `limit` (0: all); `left_out` says whether the
    result had more (known once the rows are consumed)."""

    batches: Iterator[pa.RecordBatch]
    limit: int
    left_out: bool = field(default=False)

    def rows(self) -> Iterator[tuple[object, ...]]:
        shown = 0
        for batch in self.batches:
            for row in rows_of(batch):
                if self.limit and shown == self.limit:
                    self.left_out = True  # the rest is never read
                    return
                shown += 1
                yield row


def print_query(lake: Lake, sql: str, json_out: bool, console: Console, limit: int = DEFAULT_LIMIT) -> int:
    """Print the result of `sql`, at most `limit` rows (0: all); return the rows printed."""
    with stream_query(lake, sql, batch_rows=BATCH_ROWS) as stream:
        limited = _Limited(stream.batches, limit)
        if json_out:
            printed = _print_json(stream.columns, limited.rows())
        else:
            printed = _print_text(stream.columns, limited.rows(), console)
    if limited.left_out:
        note = f"(the first {limit} rows; the rest were left out: raise --limit, or --limit 0 for every row)"
        if json_out:
            print(note, file=sys.stderr)
        else:
            console.print(note, markup=False, highlight=False, soft_wrap=True)
    return printed


def _print_json(columns: tuple[str, ...], rows: Iterator[tuple[object, ...]]) -> int:
    count = 0
    for row in rows:
        text = json.dumps(dict(zip(columns, row)), indent=2, default=str)
        sys.stdout.write(("[\n" if count == 0 else ",\n") + "\n".join("  " + line for line in text.splitlines()))
        count += 1
    sys.stdout.write("\n]\n" if count else "[]\n")
    sys.stdout.flush()
    return count


def _print_text(columns: tuple[str, ...], rows: Iterator[tuple[object, ...]], console: Console) -> int:
    count, wide = 0, None
    for page in _pages(rows):
        cells = [[format_value(value) for value in row] for row in page]
        if wide is None:
            wide = table_width(columns, cells) > console.width  # too many columns: one record per row
        if wide:
            name_width = max((len(column) for column in columns), default=0)
            for index, row in enumerate(cells, count + 1):
                console.print(f"-- row {index} --", markup=False, highlight=False)
                for column, cell in zip(columns, row):
                    console.print(f"{column.ljust(name_width)}  {cell}", markup=False, highlight=False, soft_wrap=True)
        else:
            table = Table(*columns)
            for row in cells:
                table.add_row(*row)
            console.print(table)
        count += len(cells)
    if count == 0 and columns:
        console.print(Table(*columns))
    return count


def _pages(rows: Iterator[tuple[object, ...]]) -> Iterator[list[tuple[object, ...]]]:
    page: list[tuple[object, ...]] = []
    for row in rows:
        page.append(row)
        if len(page) == PAGE_ROWS:
            yield page
            page = []
    if page:
        yield page


def table_width(columns: tuple[str, ...], cells: list[list[str]]) -> int:
    """Characters a table needs to show every header whole and cells up to CELL_CHARS characters."""
    widths = [max([len(column)] + [min(len(row[index]), CELL_CHARS) for row in cells]) for index, column in enumerate(columns)]
    return sum(width + 3 for width in widths) + 1


def format_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)
