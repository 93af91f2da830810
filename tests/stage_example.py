"""An example stage, written exactly as a module under ``megacpp_core/stages/`` would be:
per-file line statistics of the scrubbed text, one revision × shard at a time. Adding it to the platform is this module
plus one line in the registry (``STAGES = (..., line_stats.STAGE)``); see docs/stages.md.
"""

from __future__ import annotations

import pandera.pandas as pa_schema
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_checks.schemas import validate_frame
from megacpp_core import catalog
from megacpp_core.stage import Dataset, Partitioning, Result, Stage

#: The stage's own output. A dataset only this stage writes and no other stage reads may be
#: declared here; once another stage reads it, it moves to megacpp_core/catalog.py.
LINE_STATS = Dataset(
    "line_stats", Partitioning.REVISION_SHARD, "revisions/{source}/shards/{shard}/line_stats.parquet",
    schema=lambda t: validate_frame(pa_schema.DataFrameSchema({
        "doc_key": pa_schema.Column(str, unique=True),
        "lines": pa_schema.Column("int64", pa_schema.Check.ge(1)),
        "blank_lines": pa_schema.Column("int64", pa_schema.Check.ge(0)),
        "longest_line": pa_schema.Column("int64", pa_schema.Check.ge(0)),
    }, checks=[pa_schema.Check(lambda df: df["blank_lines"] <= df["lines"], error="blank ≤ lines")], strict=True),
        t, "line_stats"),
    description="one row per scrubbed file: lines, blank lines, longest line (characters)")


def compute(ctx) -> Result:
    docs = ctx.input("scrubbed").read(columns=["doc_key", "text"])
    texts = docs.column("text").to_pylist()
    lines = [t.split("\n") for t in texts]
    table = pa.table({"doc_key": docs.column("doc_key"),
                      "lines": pa.array([len(x) for x in lines], pa.int64()),
                      "blank_lines": pa.array([sum(1 for s in x if not s.strip()) for x in lines], pa.int64()),
                      "longest_line": pa.array([max(map(len, x)) for x in lines], pa.int64())})
    return Result({"line_stats": table}, {"files": table.num_rows, "lines": int(pc.sum(table.column("lines")).as_py() or 0)})


def every_file_counted(g):
    """One row per scrubbed file."""
    n = g.input("scrubbed").parquet_file().metadata.num_rows
    return g.value("line_stats").num_rows == n, f"{g.value('line_stats').num_rows} rows for {n} files"


STAGE = Stage(
    name="line_stats", asset="line_stats", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="1",
    description="Per-file line statistics of the scrubbed text.",
    inputs=(catalog.SCRUBBED,), outputs=(LINE_STATS,), gates=(every_file_counted,), figures=("files", "lines"),
)
