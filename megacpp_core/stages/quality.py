"""Stage 1 — quality filter: extension whitelist and code heuristics (SPEC §4 "Quality").

Per repo revision × shard (:mod:`megacpp_core.sharding`). Input: ``source_files``. Outputs: ``quality_kept`` (decoded text of
every kept file) and ``exclusions`` (every rejected file with its filter, measured value
and threshold). The rules are :mod:`megacpp_core.quality`.
"""

from __future__ import annotations

import pyarrow.compute as pc

from .. import catalog, quality
from ..stage import Partitioning, Result, Stage

SETTINGS = ("extensions", "max_file_bytes", "min_file_bytes", "max_line_length", "min_unique_lines_ratio",
            "max_comment_ratio", "generated_markers", "generated_marker_lines", "max_entropy", "max_entropy_coverage",
            "max_lines", "max_mean_line_length", "min_alpha_fraction", "max_encoded_run_chars", "max_encoded_share")


def compute(ctx) -> Result:
    files = ctx.input("source_files").read()
    kept, excl, figures = quality.filter_files(files, ctx.settings)
    return Result({"quality_kept": kept, "exclusions": excl}, figures)


def counts_add_up(g):
    """Files in = files kept + files rejected, per filter."""
    f = g.figures
    rejected = sum(f["rejected"].values())
    return f["files_in"] == f["files_out"] + rejected, f"{f['files_in']} in = {f['files_out']} kept + {rejected} rejected"


def every_rejection_has_reason(g):
    """Every exclusions row names the filter that rejected the file."""
    excl = g.read("exclusions", columns=["filter"])
    ok = excl.num_rows == 0 or pc.all(pc.invert(pc.is_null(excl.column("filter")))).as_py()
    return bool(ok), f"{excl.num_rows} exclusions"


STAGE = Stage(
    name="quality", asset="quality_files", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="1",
    description="Stage 1: extension whitelist and quality heuristics; rejected files go to the exclusions table.",
    inputs=(catalog.SOURCE_FILES,), outputs=(catalog.QUALITY_KEPT, catalog.EXCLUSIONS), settings=SETTINGS,
    gates=(counts_add_up, every_rejection_has_reason),
    figures=("files_in", "files_out", "bytes_in", "bytes_out", "rejected"),
)
