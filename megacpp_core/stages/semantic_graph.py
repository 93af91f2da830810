"""libclang lane, step 2 — the semantic graph of one revision (SPEC §4, optional layer 5).

Per repo revision, its own pod and pool (``heavy="libclang"``); a no-op unless
``settings.semantic_graph``. Inputs: ``compile_commands`` (refused when built for another
revision or other inputs), ``source_files`` (the tree) and ``scrubbed`` (kept files are
parsed as scrubbed, so no secret reaches libclang and line numbers match the text the
units come from). Outputs: ``semantic_edges`` (USR-resolved call/type/include edges plus
``from_chunk``/``to_chunk``, the file unit holding each end, null outside the kept files)
and ``build_info`` (one row per translation unit). libclang runs in a process pool with a
per-TU timeout (:mod:`megacpp_core.semantic`).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pyarrow as pa

from .. import acquire, catalog, compile_commands, enrich, semantic
from ..stage import Partitioning, Result, Stage, StageError


def _progress(what: str, emit, every_s: float = 30.0):
    """A ``progress(done, total)`` callback that logs ``what: done/total`` at most every
    ``every_s`` seconds and at the end."""
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= every_s:
            last[0] = now
            emit(f"{what}: {done}/{total} translation units")

    return progress


def compute(ctx) -> Result:
    source, s = ctx.source, ctx.settings
    files, revision = acquire.tree_files(acquire.revision_table(ctx.inputs("source_files"), ["path", "content", "revision"]))
    try:
        db = compile_commands.load_database(ctx.input("compile_commands").read_text(), files, revision)
    except (FileNotFoundError, ValueError) as e:
        raise StageError(f"semantic_graph {source.name}: no current compile database: {e}") from e
    kept = acquire.revision_table(ctx.inputs("scrubbed"), ["path", "language", "text"]).to_pydict()
    kept_text = {p: (t, lang) for p, lang, t in zip(kept["path"], kept["language"], kept["text"])}
    tus = dataclasses.replace(db, entries=[e for e in db.entries if e["file"] in kept_text])
    tree_files = [(p, kept_text[p][0].encode("utf-8", "surrogatepass") if p in kept_text else data) for p, data in files]
    with ctx.scratch("semantic-") as tmp:
        semantic.materialize_tree(tree_files, tmp, tus)
        result = semantic.run_semantic(str(tmp), tus, workers=s.semantic_workers, timeout_s=s.semantic_timeout_s,
                                       progress=_progress(f"semantic_graph {source.name}", ctx.log))
    edges = result.edges
    chunk_cols = {"from_chunk": np.full(edges.num_rows, -1, np.int32), "to_chunk": np.full(edges.num_rows, -1, np.int32)}
    rows_by_file: dict[tuple[str, str], list[int]] = {}
    for end in ("from", "to"):
        for k, path in enumerate(edges.column(f"{end}_file").to_pylist()):
            if path in kept_text:
                rows_by_file.setdefault((path, end), []).append(k)
    units_of: dict[str, list] = {}
    for (path, end), rows in sorted(rows_by_file.items()):
        text, lang = kept_text[path]
        if path not in units_of:
            units_of[path] = enrich.file_units(text, lang)
        idx = np.asarray(rows, dtype=np.int64)
        lines = edges.column(f"{end}_line").take(pa.array(idx)).to_numpy(zero_copy_only=False)
        chunk_cols[f"{end}_chunk"][idx] = enrich.line_units(text, units_of[path], lines)
    for name, arr in chunk_cols.items():
        edges = edges.append_column(pa.field(name, pa.int32()), pa.array(arr, mask=arr < 0, type=pa.int32()))
    f = result.figures
    mapped = int(np.sum((chunk_cols["from_chunk"] >= 0) & (chunk_cols["to_chunk"] >= 0)))
    figures = {"enabled": True, "shipped": bool(db.shipped), "tus": len(tus.entries), "edges_on_kept_units": mapped,
               **{k: v for k, v in f.items() if k in LANE_FIGURES}, "lane_wall_seconds": f.get("wall_seconds")}
    return Result({"semantic_edges": edges, "build_info": result.build_info}, figures)


#: Figures of :func:`megacpp_core.semantic.run_semantic` carried into the stage's figures.
LANE_FIGURES = ("revision", "tus_total", *(f"tus_{x}" for x in semantic.STATUSES), "tu_coverage", "call_sites",
                "calls_resolved", "calls_resolved_tree", "call_coverage", "call_coverage_tree", "edges", "edges_call",
                "edges_type", "edges_include", "walk_errors", "parse_seconds", "workers", "worker_processes",
                "tus_per_second_per_process", "peak_rss_mb_per_worker", "peak_rss_mb_max", "timeout_s")


def every_tu_accounted(g):
    """Every translation unit of the database has a status (ok, errors, fatal, timeout, crashed)."""
    statuses = g.value("build_info").column("status").to_pylist()
    tus = g.figures["tus"]
    ok = len(statuses) == tus and all(x in semantic.STATUSES for x in statuses)
    return ok, f"{len(statuses)} of {tus} TUs with a status: " + ", ".join(f"{k} {statuses.count(k)}" for k in semantic.STATUSES)


STAGE = Stage(
    name="semantic_graph", asset="semantic_graph", partitioning=Partitioning.REVISION, compute=compute, code_version="1",
    description="libclang lane (optional layer 5): every kept translation unit parsed by libclang in a process pool "
                "with a per-TU timeout; USR-resolved call/type/include edges and build_info provenance. No-op unless "
                "settings.semantic_graph.",
    inputs=(catalog.COMPILE_COMMANDS, catalog.SOURCE_FILES, catalog.SCRUBBED),
    outputs=(catalog.SEMANTIC_EDGES, catalog.BUILD_INFO),
    settings=("semantic_graph", "semantic_workers", "semantic_timeout_s"), enabled="semantic_graph",
    gates=(every_tu_accounted,), heavy="libclang",
    figures=("enabled", "shipped", "tus", "edges_on_kept_units", "lane_wall_seconds", *LANE_FIGURES),
)
