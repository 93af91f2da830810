"""Stage runners: read a stage's inputs under the data root, call the stage, write outputs.

Each ``run_*`` function is what one Dagster asset does, without Dagster: it reads the
parquet written by the stage before, calls the stage module, writes its own parquet
(atomically) and returns a ``StageResult`` with figures for the UI and the dataset card.
Per-revision stages take ``(layout, manifest, source)``; snapshot stages take
``(layout, manifest)`` and fan in over every source of the manifest, in manifest order.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import acquire, chunk, chunk_dedup, dedup, license, megatron, minhash, pack, quality, scrub, tokenize
from . import tokenizer as tk
from .layout import SnapshotLayout
from .manifest import Manifest, Source
from .tables import atomic_write_text, read_parquet, write_parquet

log = logging.getLogger("megacpp.pipeline")


@dataclass
class StageResult:
    """What a stage produced: output paths and figures (JSON-serializable)."""

    stage: str
    outputs: dict[str, str]
    figures: dict[str, Any]
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)


class StageError(RuntimeError):
    """A stage's gate failed; nothing downstream may read its outputs."""


def _timed(layout: SnapshotLayout, stage: str, source: str | None, started: float, res: StageResult) -> StageResult:
    res.figures["wall_seconds"] = round(time.perf_counter() - started, 3)
    layout.write_figures(stage, res.figures, source)
    brief = ", ".join(f"{k}={res.figures[k]}" for k in ("files", "files_out", "documents", "tokens", "rows", "vocab_size")
                      if isinstance(res.figures.get(k), int))
    log.info("%-12s %-28s %7.1fs  %s", stage, source or layout.snapshot, res.figures["wall_seconds"], brief)
    return res


def value_counts(column: pa.ChunkedArray | pa.Array) -> dict[str, int]:
    """``{value: count}`` sorted by value; nulls count under ``"none"``."""
    vc = pc.value_counts(column.fill_null("none")).to_pylist()
    return {d["values"]: d["counts"] for d in sorted(vc, key=lambda d: d["values"])}


def save_manifest_copy(layout: SnapshotLayout, manifest: Manifest) -> Path:
    """Record the manifest a snapshot was materialized from (``snapshots/NAME/manifest.yaml``)."""
    dest = layout.root / "manifest.yaml"
    atomic_write_text(dest, manifest.path.read_text(encoding="utf-8"))
    return dest


# --------------------------------------------------------------------------- stage 0

def run_acquire(layout: SnapshotLayout, manifest: Manifest, source: Source) -> StageResult:
    """Fetch (or reuse) the pinned source of any kind and write ``revisions/SOURCE/source_files.parquet``.

    A fetch, pin or safe-extraction failure raises before anything is written, and an
    earlier ``source_files.parquet`` of the partition is removed first so that no stale
    output survives a failed run.
    """
    t0 = time.perf_counter()
    out_path = layout.revision(source.name) / "source_files.parquet"
    out_path.unlink(missing_ok=True)
    acquired = acquire.acquire_source(source, layout.cache)
    table = acquire.source_files_table(manifest.name, source, acquired)
    out = write_parquet(table, out_path)
    figures = {
        "source": source.name, "kind": source.kind, "version": source.version,
        "archive": acquired.origin, "revision": acquired.revision, "archive_sha256": acquired.archive_sha256 or acquired.revision,
        "from_cache": acquired.from_cache, "pin": manifest.revision_pin(source),
        "files": table.num_rows, "bytes": int(pc.sum(table.column("size")).as_py() or 0),
        "languages": value_counts(table.column("language")),
    }
    res = StageResult("acquire", {"source_files": str(out)}, figures)
    res.checks["hash_matches_pin"] = (acquired.pin_ok, f"{source.kind} revision {acquired.revision}")
    from megacpp_checks.schemas.acquire import validate_source_files

    ok, detail = validate_source_files(table)
    res.checks["source_files_schema"] = (ok, detail)
    return _timed(layout, "acquire", source.name, t0, res)


def source_revision(layout: SnapshotLayout, source: Source) -> str | None:
    """The revision recorded by stage 0 for ``source`` (archive sha256, commit sha or local hash)."""
    fig = layout.read_figures("acquire", source.name) or {}
    return fig.get("revision") or source.sha256


# --------------------------------------------------------------------------- stage 1

def run_quality(layout: SnapshotLayout, manifest: Manifest, source: Source) -> StageResult:
    """Apply the quality filters; write ``quality_kept.parquet`` and ``exclusions.parquet``."""
    t0 = time.perf_counter()
    rdir = layout.revision(source.name)
    files = read_parquet(rdir / "source_files.parquet")
    kept, excl, figures = quality.filter_files(files, manifest.settings)
    write_parquet(kept, rdir / "quality_kept.parquet")
    write_parquet(excl, rdir / "exclusions.parquet")
    res = StageResult("quality", {"kept": str(rdir / "quality_kept.parquet"), "exclusions": str(rdir / "exclusions.parquet")}, figures)
    adds_up = figures["files_in"] == figures["files_out"] + sum(figures["rejected"].values())
    reasons = excl.num_rows == 0 or pc.all(pc.invert(pc.is_null(excl.column("filter")))).as_py()
    res.checks["counts_add_up"] = (bool(adds_up), f"{figures['files_in']} in = {figures['files_out']} kept + {sum(figures['rejected'].values())} rejected")
    res.checks["every_rejection_has_reason"] = (bool(reasons), f"{excl.num_rows} exclusions")
    from megacpp_checks.schemas import quality as quality_schema

    checks = [quality_schema.validate_kept(kept), quality_schema.validate_exclusions(excl)]
    res.checks["quality_schema"] = (all(ok for ok, _ in checks), "; ".join(d for _, d in checks))
    return _timed(layout, "quality", source.name, t0, res)


# --------------------------------------------------------------------------- stage 2

_SCANNER: license.Scanner | None = None


def shared_scanner() -> license.Scanner:
    """One ScanCode wrapper per process: its index loads once and its cache is shared."""
    global _SCANNER
    if _SCANNER is None:
        _SCANNER = license.Scanner()
    return _SCANNER


def license_policy(manifest: Manifest) -> license.LicensePolicy:
    """The snapshot's license policy from its settings (SPEC §4 defaults)."""
    s = manifest.settings
    return license.LicensePolicy(unknown_decision=s.license_unknown_decision,
                                 weak_copyleft_decision=s.license_weak_copyleft_decision,
                                 gpl2_decision=s.license_gpl2_decision,
                                 refused_sources=frozenset(s.refused_sources),
                                 extra_permissive=frozenset(s.license_permissive_ids),
                                 extra_refused=frozenset(s.license_refused_ids))


LICENSE_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("path", pa.string()),
    ("spdx_expression", pa.string()), ("license_class", pa.string()), ("decision", pa.string()),
    ("reason", pa.string()), ("origin", pa.string()), ("license_file", pa.string()),
])


def run_license(layout: SnapshotLayout, manifest: Manifest, source: Source, scanner: license.Scanner | None = None) -> StageResult:
    """Decide a license for every kept file; write ``license.parquet`` (all decisions)."""
    t0 = time.perf_counter()
    rdir = layout.revision(source.name)
    files = read_parquet(rdir / "source_files.parquet", columns=["path", "content", "size"])
    kept = read_parquet(rdir / "quality_kept.parquet", columns=["doc_key", "path", "text"])
    kept_text = dict(zip(kept.column("path").to_pylist(), kept.column("text").to_pylist()))
    texts: dict[str, str] = {}
    for p, b, size in zip(files.column("path").to_pylist(), files.column("content").to_pylist(), files.column("size").to_pylist()):
        if p in kept_text:
            texts[p] = kept_text[p]
        elif license.is_license_file(p) and size <= 1_000_000:
            texts[p] = b.decode("utf-8", errors="replace")
    scanner = scanner or shared_scanner()
    rows = license.scan_revision(source.name, texts, kept_text.keys(), license_policy(manifest), scanner)
    key_by_path = dict(zip(kept.column("path").to_pylist(), kept.column("doc_key").to_pylist()))
    cols = {f.name: [] for f in LICENSE_SCHEMA}
    for r in rows:
        cols["doc_key"].append(key_by_path[r["path"]])
        cols["source"].append(source.name)
        for k in ("path", "spdx_expression", "license_class", "decision", "reason", "origin", "license_file"):
            cols[k].append(r.get(k))
    table = pa.table(cols, schema=LICENSE_SCHEMA)
    write_parquet(table, rdir / "license.parquet")
    counts = lambda c: value_counts(table.column(c))
    figures = {"files_in": table.num_rows,
               "files_out": int(sum(1 for d in cols["decision"] if d != "refuse")),
               "classes": counts("license_class"), "decisions": counts("decision"), "origins": counts("origin"),
               "expressions": counts("spdx_expression")}
    res = StageResult("license", {"license": str(rdir / "license.parquet")}, figures)
    undecided = sum(1 for d in cols["decision"] if d not in ("accept", "accept_tagged", "refuse"))
    res.checks["every_file_decided"] = (undecided == 0 and table.num_rows == kept.num_rows,
                                        f"{table.num_rows} decisions for {kept.num_rows} kept files, {undecided} undecided")
    from megacpp_checks.schemas import license as license_schema

    res.checks["license_schema"] = license_schema.validate_license(table)
    res.figures["scancode_runs"] = scanner.scans
    res.figures["scancode_cache_hits"] = scanner.cache_hits
    return _timed(layout, "license", source.name, t0, res)


# --------------------------------------------------------------------------- stage 3

SCRUBBED_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("source_order", pa.int32()), ("path", pa.string()),
    ("language", pa.string()), ("archive_sha256", pa.string()), ("license_class", pa.string()),
    ("license_decision", pa.string()), ("spdx_expression", pa.string()), ("text", pa.large_string()),
])


def run_scrub(layout: SnapshotLayout, manifest: Manifest, source: Source) -> StageResult:
    """Scrub PII and secrets from every license-accepted file; write ``scrubbed.parquet``.

    Fail closed: a re-scan of each output text must find nothing, else :class:`StageError`.
    """
    t0 = time.perf_counter()
    rdir = layout.revision(source.name)
    kept = read_parquet(rdir / "quality_kept.parquet")
    lic = read_parquet(rdir / "license.parquet")
    decision = {k: (c, d, e) for k, c, d, e in zip(lic.column("doc_key").to_pylist(), lic.column("license_class").to_pylist(),
                                                 lic.column("decision").to_pylist(), lic.column("spdx_expression").to_pylist())}
    cols = {f.name: [] for f in SCRUBBED_SCHEMA}
    revision = source_revision(layout, source)
    counts: dict[str, int] = {}
    samples: list[dict] = []
    for key, path, lang, text in zip(kept.column("doc_key").to_pylist(), kept.column("path").to_pylist(),
                                     kept.column("language").to_pylist(), kept.column("text").to_pylist()):
        cls, dec, expr = decision[key]
        if dec == "refuse":
            continue
        try:
            r = scrub.scrub_text(text)  # re-scans its own output; raises LeakError if anything remains
        except scrub.LeakError as e:
            raise StageError(f"scrub re-scan failed closed on {key}: {e}") from e
        for k, v in r.counts.items():
            counts[k] = counts.get(k, 0) + v
        for smp in r.samples:
            if len(samples) < 20:
                samples.append({"doc_key": key, **smp})
        cols["doc_key"].append(key)
        cols["source"].append(source.name)
        cols["source_order"].append(source.order)
        cols["path"].append(path)
        cols["language"].append(lang)
        cols["archive_sha256"].append(revision)
        cols["license_class"].append(cls)
        cols["license_decision"].append(dec)
        cols["spdx_expression"].append(expr)
        cols["text"].append(r.text)
    table = pa.table(cols, schema=SCRUBBED_SCHEMA)
    write_parquet(table, rdir / "scrubbed.parquet")
    figures = {"files_in": kept.num_rows, "files_out": table.num_rows, "refused_by_license": kept.num_rows - table.num_rows,
               "redactions": dict(sorted(counts.items())), "samples": samples}
    res = StageResult("scrub", {"scrubbed": str(rdir / "scrubbed.parquet")}, figures)
    refused = sum(1 for d in cols["license_decision"] if d == "refuse")
    res.checks["no_refused_license_downstream"] = (refused == 0, f"{refused} refused files in the output")
    leaking = [k for k, t in zip(cols["doc_key"], cols["text"]) if scrub.find_leaks(t)]
    res.checks["rescan_finds_nothing"] = (not leaking, f"{len(leaking)} files with leaks after scrub" + (f", first {leaking[0]}" if leaking else ""))
    from megacpp_checks.schemas import scrub as scrub_schema

    res.checks["scrub_schema"] = scrub_schema.validate_scrubbed(table)
    return _timed(layout, "scrub", source.name, t0, res)


# --------------------------------------------------------------------------- stage 6 lane (libclang)

def _revision_files(layout: SnapshotLayout, source: Source) -> tuple[list[tuple[str, bytes]], str]:
    """Every file of a revision (``source_files.parquet``) as ``(path, bytes)``, and its revision."""
    sf = read_parquet(layout.revision(source.name) / "source_files.parquet", columns=["path", "content", "revision"])
    files = list(zip(sf.column("path").to_pylist(), sf.column("content").to_pylist()))
    revision = sf.column("revision")[0].as_py() if sf.num_rows else (source_revision(layout, source) or "")
    return files, revision


def _lane_off(stage: str, source: Source, layout: SnapshotLayout, t0: float, checks: tuple[str, ...]) -> StageResult:
    res = StageResult(stage, {}, {"enabled": False})
    for c in checks:
        res.checks[c] = (True, "the libclang lane is off for this snapshot (settings.semantic_graph: false)")
    return _timed(layout, stage, source.name, t0, res)


def run_compile_commands(layout: SnapshotLayout, manifest: Manifest, source: Source) -> StageResult:
    """The revision's compile command database (SPEC §4 libclang lane): the shipped
    ``compile_commands.json`` made relative to the tree, or one synthesized from the file
    tree; nothing from the corpus runs. Written to ``compile_commands.json`` with its
    inputs' sha256 and revision; regenerated on every materialization. A no-op (figures
    ``enabled: false``) when ``settings.semantic_graph`` is off."""
    from . import compile_commands

    t0 = time.perf_counter()
    checks = ("database_current",)
    if not manifest.settings.semantic_graph:
        return _lane_off("compile_commands", source, layout, t0, checks)
    files, revision = _revision_files(layout, source)
    db = compile_commands.build_database(files, revision)
    out = atomic_write_text(layout.revision(source.name) / "compile_commands.json", db.to_json())
    figures = {"enabled": True, "shipped": db.shipped, "shipped_path": db.shipped_path, "entries": len(db.entries),
               "inputs_sha256": db.inputs_sha256, "revision": revision,
               **{f"database_{k}": v for k, v in sorted(db.figures.items()) if isinstance(v, (int, float, str, bool))}}
    res = StageResult("compile_commands", {"compile_commands": str(out)}, figures)
    try:
        compile_commands.load_database(out.read_text(), files, revision)
        res.checks["database_current"] = (True, f"{len(db.entries)} entries for revision {revision[:12]}, inputs {db.inputs_sha256[:12]}")
    except compile_commands.StaleDatabaseError as e:
        res.checks["database_current"] = (False, str(e))
    return _timed(layout, "compile_commands", source.name, t0, res)


def run_semantic_graph(layout: SnapshotLayout, manifest: Manifest, source: Source, log=None) -> StageResult:
    """Run libclang over every kept translation unit of the revision (process pool, per-TU
    timeout) and write ``semantic_edges.parquet`` (the lane's USR-resolved edges plus
    ``from_chunk``/``to_chunk``: the index of the file unit — :func:`enrich.file_units` of
    the scrubbed text — holding each end, null outside the kept files) and
    ``build_info.parquet`` (compile command, shipped or synthesized, status, diagnostics per
    TU). A no-op when ``settings.semantic_graph`` is off. Refuses a compile database built
    for another revision or other inputs (:class:`StageError`). ``log(message)`` receives a
    progress line at most every 30 s (default: this module's logger)."""
    import dataclasses
    import tempfile

    from . import compile_commands, enrich, semantic

    t0 = time.perf_counter()
    checks = ("every_tu_accounted", "semantic_schema")
    if not manifest.settings.semantic_graph:
        return _lane_off("semantic_graph", source, layout, t0, checks)
    rdir = layout.revision(source.name)
    files, revision = _revision_files(layout, source)
    try:
        db = compile_commands.load_database((rdir / "compile_commands.json").read_text(), files, revision)
    except (FileNotFoundError, compile_commands.StaleDatabaseError) as e:
        raise StageError(f"semantic_graph {source.name}: no current compile database: {e}") from e
    kept = read_parquet(rdir / "scrubbed.parquet", columns=["path", "language", "text"]).to_pydict()
    kept_text = {p: (t, lang) for p, lang, t in zip(kept["path"], kept["language"], kept["text"])}
    tus = dataclasses.replace(db, entries=[e for e in db.entries if e["file"] in kept_text])
    # kept files are parsed as scrubbed (no secret reaches libclang, and its line numbers
    # are those of the text the units come from); other files of the tree as fetched
    tree_files = [(p, kept_text[p][0].encode("utf-8", "surrogatepass") if p in kept_text else data) for p, data in files]
    s = manifest.settings
    with tempfile.TemporaryDirectory(prefix="semantic-", dir=rdir) as tmp:
        semantic.materialize_tree(tree_files, Path(tmp), tus)
        result = semantic.run_semantic(tmp, tus, workers=s.semantic_workers, timeout_s=s.semantic_timeout_s,
                                       progress=_progress_printer(f"semantic_graph {source.name}", log))
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
    write_parquet(edges, rdir / "semantic_edges.parquet")
    write_parquet(result.build_info, rdir / "build_info.parquet")
    f = result.figures
    mapped = int(np.sum((chunk_cols["from_chunk"] >= 0) & (chunk_cols["to_chunk"] >= 0)))
    figures = {"enabled": True, "shipped": bool(db.shipped), "tus": len(tus.entries), "edges_on_kept_units": mapped,
               **{k: v for k, v in f.items() if k not in ("wall_seconds", "system_include_dirs", "cuda_include_dirs")},
               "lane_wall_seconds": f.get("wall_seconds")}
    res = StageResult("semantic_graph", {"edges": str(rdir / "semantic_edges.parquet"),
                                         "build_info": str(rdir / "build_info.parquet")}, figures)
    statuses = result.build_info.column("status").to_pylist()
    accounted = len(statuses) == len(tus.entries) and all(x in semantic.STATUSES for x in statuses)
    res.checks["every_tu_accounted"] = (accounted, f"{len(statuses)} of {len(tus.entries)} TUs with a status: "
                                        + ", ".join(f"{k} {statuses.count(k)}" for k in semantic.STATUSES))
    from megacpp_checks.schemas import semantic as semantic_schema

    res.checks["semantic_schema"] = semantic_schema.validate_edges(edges)
    return _timed(layout, "semantic_graph", source.name, t0, res)


def _progress_printer(what: str, log=None, every_s: float = 30.0):
    """A ``progress(done, total)`` callback that logs ``what: done/total`` at most every
    ``every_s`` seconds and at the end."""
    emit = log or globals()["log"].info
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= every_s:
            last[0] = now
            emit(f"{what}: {done}/{total} translation units")

    return progress


def semantic_unit_edges(layout: SnapshotLayout, manifest: Manifest) -> tuple[dict[str, dict[str, set]], dict]:
    """The libclang lane's intra-file edges for stage 6: ``{doc_key of a covered file:
    {"call": {(unit, unit)}, "type": {...}}}`` and figures. A file is covered when it is a
    translation unit libclang parsed without a fatal error (status ``ok`` or ``errors``);
    its tree-sitter edges are replaced by these. Empty when the lane is off."""
    if not manifest.settings.semantic_graph:
        return {}, {"semantic_graph": False}
    out: dict[str, dict[str, set]] = {}
    per_source = {}
    for src in manifest.sources:
        rdir = layout.revision(src.name)
        if not (rdir / "semantic_edges.parquet").exists():
            raise StageError(f"chunk: the libclang lane is on but {src.name} has no semantic_edges.parquet "
                             "(materialize semantic_graph for this revision first)")
        bi = read_parquet(rdir / "build_info.parquet", columns=["file", "status"]).to_pydict()
        covered = {f for f, st in zip(bi["file"], bi["status"]) if st in ("ok", "errors")}
        e = read_parquet(rdir / "semantic_edges.parquet").to_pydict()
        for kind, ff, tf, a, b in zip(e["kind"], e["from_file"], e["to_file"], e["from_chunk"], e["to_chunk"]):
            if kind in ("call", "type") and ff == tf and ff in covered and a is not None and b is not None and a != b:
                out.setdefault(f"{src.name}/{ff}", {"call": set(), "type": set()})[kind].add((a, b))
        for f in covered:
            out.setdefault(f"{src.name}/{f}", {"call": set(), "type": set()})
        figs = layout.read_figures("semantic_graph", src.name) or {}
        per_source[src.name] = {k: figs.get(k) for k in ("tus", "tu_coverage", "call_coverage", "call_coverage_tree",
                                                         "edges", "tus_timeout", "tus_crashed")}
    return out, {"semantic_graph": True, "semantic_covered_files": len(out), "semantic_sources": per_source}


# --------------------------------------------------------------------------- stage 4

def _snapshot_scrubbed(layout: SnapshotLayout, manifest: Manifest) -> pa.Table:
    tables = [read_parquet(layout.revision(s.name) / "scrubbed.parquet") for s in manifest.sources]
    return pa.concat_tables(tables)


def signatures_table(doc_keys: list[str], sig: np.ndarray) -> pa.Table:
    """``minhash_signatures`` table: ``doc_key`` and ``signature`` as a fixed-size list of
    ``num_perm`` uint32 (4 bytes per permutation, 512 B per file at 128)."""
    flat = pa.array(np.ascontiguousarray(sig, dtype=np.uint32).ravel(), type=pa.uint32())
    return pa.table({"doc_key": pa.array(doc_keys, pa.string()),
                     "signature": pa.FixedSizeListArray.from_arrays(flat, sig.shape[1])})


def read_signatures(path: Path) -> tuple[list[str], np.ndarray]:
    """``(doc_keys, uint32[n, num_perm])`` from a ``minhash.parquet`` file."""
    t = read_parquet(path)
    col = t.column("signature").combine_chunks()  # parquet may hand back a plain list<uint32>
    flat = np.asarray(col.flatten(), dtype=np.uint32)
    n = len(col)
    if n == 0 or flat.size % n or (pc.list_value_length(col).to_numpy() != flat.size // n).any():
        if n == 0:
            return [], flat.reshape(0, 0)
        raise StageError(f"{path}: signatures are not all of one length")
    return t.column("doc_key").to_pylist(), flat.reshape(n, flat.size // n)


def run_minhash(layout: SnapshotLayout, manifest: Manifest, source: Source) -> StageResult:
    """MinHash signatures of one revision's scrubbed files; write ``revisions/SOURCE/minhash.parquet``.

    Per ``repo_revision`` partition so each can run as its own pod; signatures use the
    snapshot's ``minhash_num_perm`` and ``shingle_k`` and seed 1 (:mod:`megacpp_core.minhash`)."""
    t0 = time.perf_counter()
    s = manifest.settings
    docs = read_parquet(layout.revision(source.name) / "scrubbed.parquet", columns=["doc_key", "text"])
    texts = docs.column("text").to_pylist()
    c0 = time.process_time()
    sig = minhash.signatures(texts, num_perm=s.minhash_num_perm, k=s.shingle_k)
    cpu = time.process_time() - c0
    table = signatures_table(docs.column("doc_key").to_pylist(), sig)
    out = write_parquet(table, layout.revision(source.name) / "minhash.parquet")
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    figures = {"source": source.name, "files": len(texts), "bytes": nbytes, "num_perm": s.minhash_num_perm,
               "shingle_k": s.shingle_k, "empty_signatures": int(minhash.is_empty(sig).sum()),
               "signature_bytes": int(sig.nbytes), "mb_per_cpu_second": round(nbytes / 1e6 / cpu, 3) if cpu > 0 else 0.0}
    res = StageResult("minhash", {"signatures": str(out)}, figures)
    res.checks["one_signature_per_file"] = (table.num_rows == len(texts) and sig.shape == (len(texts), s.minhash_num_perm),
                                            f"{table.num_rows} signatures of {s.minhash_num_perm} uint32 for {len(texts)} files")
    return _timed(layout, "minhash", source.name, t0, res)


def _snapshot_signatures(layout: SnapshotLayout, manifest: Manifest) -> tuple[list[str], list[str], np.ndarray]:
    keys, srcs, sigs = [], [], []
    for src in manifest.sources:
        k, sg = read_signatures(layout.revision(src.name) / "minhash.parquet")
        keys += k
        srcs += [src.name] * len(k)
        sigs.append(sg)
    width = manifest.settings.minhash_num_perm
    sigs = [sg if len(sg) else np.zeros((0, width), np.uint32) for sg in sigs]
    return keys, srcs, (np.concatenate(sigs) if sigs else np.zeros((0, width), np.uint32))


def lsh_band_file(layout: SnapshotLayout, band_lo: int, band_hi: int) -> Path:
    """Where the cross-source LSH step for bands ``[band_lo, band_hi)`` writes its pairs."""
    return layout.stage_dir("dedup") / f"lsh_bands_{band_lo:02d}_{band_hi:02d}.parquet"


def run_lsh_bands(layout: SnapshotLayout, manifest: Manifest, band_lo: int, band_hi: int) -> StageResult:
    """Cross-source LSH candidate pairs of bands ``[band_lo, band_hi)`` (of 14 × 8) over every
    revision's signatures; write ``dedup/lsh_bands_LO_HI.parquet`` (``doc_key_a < doc_key_b``)."""
    t0 = time.perf_counter()
    keys, srcs, sig = _snapshot_signatures(layout, manifest)
    order = {x.name: i for i, x in enumerate(manifest.sources)}
    src_id = np.array([order[n] for n in srcs], dtype=np.int64)
    pairs = dedup.cross_source_candidates(sig, src_id, band_lo, band_hi)
    a = [keys[i] for i in pairs[:, 0]]
    b = [keys[j] for j in pairs[:, 1]]
    rows = sorted((min(x, y), max(x, y)) for x, y in zip(a, b))
    table = pa.table({"doc_key_a": pa.array([r[0] for r in rows], pa.string()),
                      "doc_key_b": pa.array([r[1] for r in rows], pa.string())})
    out = write_parquet(table, lsh_band_file(layout, band_lo, band_hi))
    figures = {"band_lo": band_lo, "band_hi": band_hi, "rows_per_band": dedup.CROSS_ROWS, "documents": len(keys),
               "candidate_pairs": table.num_rows, "index_bytes_per_document": (band_hi - band_lo) * 12}
    res = StageResult(f"lsh_bands_{band_lo:02d}_{band_hi:02d}", {"pairs": str(out)}, figures)
    cross = all(srcs[i] != srcs[j] for i, j in pairs.tolist())
    res.checks["pairs_cross_source"] = (cross, f"{table.num_rows} candidate pairs, all across sources" if cross else "same-source pair found")
    return _timed(layout, res.stage, None, t0, res)


def run_dedup(layout: SnapshotLayout, manifest: Manifest, band_ranges: list[tuple[int, int]] | None = None) -> StageResult:
    """Exact, near and cross-source dedup across every source; write ``dedup/decisions.parquet``,
    ``dedup/duplicate_clusters.parquet`` and ``dedup/kept.parquet``.

    Uses the per-revision ``minhash.parquet`` signatures when present (computed here
    otherwise) and, when ``band_ranges`` is given, merges the cross-source candidate pairs
    written by :func:`run_lsh_bands` for those ranges (they must cover bands 0–13)."""
    t0 = time.perf_counter()
    s = manifest.settings
    docs = _snapshot_scrubbed(layout, manifest)
    d = docs.to_pydict()
    records = [dedup.DedupRecord(doc_key=d["doc_key"][i], source=d["source"][i], source_order=d["source_order"][i],
                                 path=d["path"][i], license_class=d["license_class"][i], text=d["text"][i])
               for i in range(docs.num_rows)]
    sigs = None
    if all((layout.revision(x.name) / "minhash.parquet").exists() for x in manifest.sources):
        keys, _, sig = _snapshot_signatures(layout, manifest)
        sigs = dict(zip(keys, sig)) if sig.shape[1] == s.minhash_num_perm else None
    cross_pairs = None
    if band_ranges is not None:
        covered = sorted(b for lo, hi in band_ranges for b in range(lo, hi))
        if covered != list(range(dedup.CROSS_BANDS)):
            raise StageError(f"band ranges {band_ranges} do not cover bands 0-{dedup.CROSS_BANDS - 1} exactly once")
        cross_pairs = []
        for lo, hi in band_ranges:
            t = read_parquet(lsh_band_file(layout, lo, hi))
            cross_pairs += list(zip(t.column("doc_key_a").to_pylist(), t.column("doc_key_b").to_pylist()))
    result = dedup.deduplicate(records, num_perm=s.minhash_num_perm, threshold=s.minhash_threshold, shingle_k=s.shingle_k,
                               signatures=sigs, cross_pairs=cross_pairs)
    decisions = pa.Table.from_pylist(result.decisions, schema=DECISIONS_SCHEMA)
    clusters = pa.Table.from_pylist(result.clusters, schema=CLUSTERS_SCHEMA)
    out_dir = layout.stage_dir("dedup")
    write_parquet(decisions, out_dir / "decisions.parquet")
    write_parquet(clusters, out_dir / "duplicate_clusters.parquet")
    keep = {r["doc_key"] for r in result.decisions if r["keep"]}
    kept = docs.filter(pa.array([k in keep for k in d["doc_key"]], type=pa.bool_()))
    # keep order for every later stage: license rank, source order, path
    k = kept.select(["license_class", "source_order", "path"]).to_pydict()
    order = sorted(range(kept.num_rows), key=lambda i: (dedup.LICENSE_RANK[k["license_class"][i]], k["source_order"][i], k["path"][i]))
    kept = kept.take(pa.array(order, type=pa.int64()))
    write_parquet(kept, out_dir / "kept.parquet")
    figures = dict(result.figures)
    figures["bytes_out"] = int(sum(len(t.encode("utf-8")) for t in kept.column("text").to_pylist()))
    figures["signatures_precomputed"] = sigs is not None
    figures["cross_pairs_from_band_steps"] = band_ranges is not None
    res = StageResult("dedup", {"decisions": str(out_dir / "decisions.parquet"), "kept": str(out_dir / "kept.parquet"),
                                "duplicate_clusters": str(out_dir / "duplicate_clusters.parquet")}, figures)
    from megacpp_checks.schemas import dedup as dedup_schema

    res.checks["each_drop_names_kept_twin"] = dedup_schema.validate_decisions(decisions, clusters)
    return _timed(layout, "dedup", None, t0, res)


DECISIONS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("keep", pa.bool_()), ("dup_kind", pa.string()), ("kept_twin", pa.string()),
    ("jaccard", pa.float64()), ("cluster_id", pa.int64()), ("content_sha256", pa.string()),
])
CLUSTERS_SCHEMA = pa.schema([
    ("cluster_id", pa.int64()), ("cluster_size", pa.int64()), ("doc_key", pa.string()), ("source", pa.string()),
    ("is_kept", pa.bool_()), ("kept_doc_key", pa.string()), ("dup_kind", pa.string()), ("jaccard_to_kept", pa.float64()),
])


# --------------------------------------------------------------------------- stage 5

def run_tokenizer(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Train the hybrid tokenizer on the deduplicated snapshot, or take the manifest's pinned
    ``tokenizer: {path, sha256}`` (sha256 checked, no training); write ``tokenizer/``.

    Gates: exact vocabulary size, special and fixed tokens at their IDs, and
    ``decode(encode(text)) == text`` for every document (a failure raises :class:`StageError`).
    """
    t0 = time.perf_counter()
    kept = read_parquet(layout.stage_dir("dedup") / "kept.parquet", columns=["doc_key", "text"])
    texts = kept.column("text").to_pylist()
    out_dir = layout.stage_dir("tokenizer")
    vocab_size = manifest.settings.vocab_size
    if manifest.tokenizer is not None:
        pin = manifest.tokenizer
        try:
            _, lay = tk.pin_tokenizer(pin["path"], pin["sha256"], vocab_size)
        except (tk.TokenizerMismatchError, FileNotFoundError) as e:
            raise StageError(f"pinned tokenizer refused: {e}") from e
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / (tk.TOKENIZER_FILE + ".tmp")
        shutil.copyfile(pin["path"], tmp)  # bytes as pinned, so the sha256 carries over
        tmp.replace(out_dir / tk.TOKENIZER_FILE)
        info = {"tokenizer_file": tk.TOKENIZER_FILE, "tokenizer_sha256": tk.tokenizer_sha256(out_dir / tk.TOKENIZER_FILE),
                "tokenizers_version": tokenizers_version(), "pinned": {"path": pin["path"], "sha256": pin["sha256"]},
                "snapshot": manifest.name, "special_tokens": tk.SPECIAL_TOKENS, "encode_special_tokens": True,
                "training_documents": 0, **lay}
        atomic_write_text(out_dir / tk.MANIFEST_FILE, json.dumps(info, sort_keys=True, indent=2) + "\n")
        fixed_count, learned, reserved, bands = lay["fixed"], lay["learned"], lay["reserved"], lay["bands"]
    else:
        build = tk.train_tokenizer(texts, vocab_size=vocab_size)
        info = tk.save_tokenizer(build, out_dir, extra={"snapshot": manifest.name})
        fixed_count, learned, reserved, bands = build.fixed, build.learned, build.reserved, build.bands
    tok = tk.load_tokenizer(out_dir / tk.TOKENIZER_FILE, info["tokenizer_sha256"])
    failures = tk.check_round_trip(tok, zip(kept.column("doc_key").to_pylist(), texts))
    if failures:
        raise StageError(f"tokenizer round trip fails on {len(failures)} documents, first {failures[0]}")
    fixed = tk.SPECIAL_TOKENS + (tk.fixed_tokens() if fixed_count else [])
    ok_ids = all(tok.token_to_id(t) == i for i, t in enumerate(fixed))
    figures = {"vocab_size": vocab_size, "fixed": fixed_count, "learned": learned, "reserved": reserved,
               "sha256": info["tokenizer_sha256"], "bands": bands, "training_documents": len(texts),
               "pinned": manifest.tokenizer is not None, "seed_morphemes": len(info.get("seed_morphemes") or {})}
    res = StageResult("tokenizer", {"tokenizer": str(out_dir / tk.TOKENIZER_FILE)}, figures)
    res.checks["vocab_size_exact"] = (tok.get_vocab_size(with_added_tokens=True) == vocab_size,
                                      f"{tok.get_vocab_size(with_added_tokens=True)} ids, reserved fill {reserved}")
    res.checks["fixed_special_ids"] = (ok_ids, f"special tokens at ids 0-63, {fixed_count} fixed-band tokens at their ids")
    res.checks["round_trip_every_document"] = (not failures, f"{len(texts) - len(failures)}/{len(texts)} documents round-trip exactly")
    return _timed(layout, "tokenizer", None, t0, res)


def tokenizers_version() -> str:
    """Version string of the installed HuggingFace ``tokenizers`` package."""
    import tokenizers

    return tokenizers.__version__


def _load_snapshot_tokenizer(layout: SnapshotLayout):
    info = json.loads((layout.stage_dir("tokenizer") / "tokenizer_manifest.json").read_text())
    info["sha256"] = info["tokenizer_sha256"]
    tok = tk.load_tokenizer(layout.stage_dir("tokenizer") / "tokenizer.json", info["sha256"])
    return tok, info


# --------------------------------------------------------------------------- stage 6

DOCUMENTS_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("file_key", pa.string()), ("source", pa.string()), ("path", pa.string()),
    ("revision", pa.string()), ("language", pa.string()), ("license_class", pa.string()),
    ("chunk_index", pa.int32()), ("n_chunks", pa.int32()), ("start", pa.int64()), ("end", pa.int64()),
    ("kind", pa.string()), ("name", pa.string()), ("n_text_tokens", pa.int32()), ("bucket", pa.int32()),
    ("text", pa.large_string()),
])
#: Stage-6 enrichment columns (character level; stage 8 aligns them to tokens). The
#: ``char_*`` planes hold one uint8 per ``str`` character of ``text`` as bytes;
#: ``char_chunk_boundaries`` are character offsets relative to the document.
ENRICHED_COLUMNS = pa.schema([
    ("char_chunk_boundaries", pa.list_(pack.CHUNK_TYPE)),
    ("call_edges", pa.list_(pack.EDGE_TYPE)),
    ("type_edges", pa.list_(pack.EDGE_TYPE)),
    ("platform_ids", pack.PLATFORM_TYPE),
    ("char_structure", pa.large_binary()),
    ("char_ast_depth", pa.large_binary()),
    ("char_sibling_index", pa.large_binary()),
    ("char_ast_node_type", pa.large_binary()),
])


def run_chunk(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Split every kept file at declaration boundaries under ``row_length - 1`` tokens (one
    slot is the document's BOS), assign each document its bucket, and enrich it (structure
    and AST planes per character, chunk list, call/type edges, platform labels) unless
    ``settings.enrichment`` is off; write ``documents/chunks.parquet``.

    Files whose tree has ERROR nodes are cut by the brace-balanced splitter; the share is
    reported as ``brace_fallback_rate``.
    """
    from . import enrich, platforms

    t0 = time.perf_counter()
    tok, info = _load_snapshot_tokenizer(layout)
    budget = manifest.settings.row_length - 1
    enriching = manifest.settings.enrichment
    kept = read_parquet(layout.stage_dir("dedup") / "kept.parquet")
    d = kept.to_pydict()
    schema = DOCUMENTS_SCHEMA
    if enriching:
        for f in ENRICHED_COLUMNS:
            schema = schema.append(f)
    cols = {f.name: [] for f in schema}
    parse_errors = fallback = brace_files = split_files = 0
    enrich_seconds = 0.0
    lane_edges, lane_figs = semantic_unit_edges(layout, manifest) if enriching else ({}, {"semantic_graph": False})
    lane_docs = 0
    # every whole file is counted first in one parallel batch; most files fit whole
    tk._require_literal_specials(tok)
    whole_counts: list[int] = []
    for b in range(0, len(d["text"]), 4096):  # batches: keep the lengths, not the encodings
        whole_counts.extend(len(e.ids) for e in tok.encode_batch(d["text"][b:b + 4096], add_special_tokens=False))
    current: list = [None, 0]

    def counter(text: str) -> int:
        if text is current[0]:
            return current[1]
        return tk.count_tokens(tok, text)

    for i in range(kept.num_rows):
        text = d["text"][i]
        current[:] = [text, whole_counts[i]]
        parsed = chunk.parse_source(text, d["language"][i]) if text else None
        chunks, stats = chunk.split_document_with_stats(text, d["language"][i], counter, budget, d["doc_key"][i], parsed)
        parse_errors += bool(stats.get("parse_errors"))
        brace_files += bool(stats.get("brace_fallback"))
        fallback += int(stats.get("fallback_splits", 0))
        split_files += len(chunks) > 1
        if enriching and chunks:
            te = time.perf_counter()
            fe = enrich.enrich_file(text, d["language"][i], parsed)
            enrich_seconds += time.perf_counter() - te
        for j, c in enumerate(chunks):
            doc_text = text[c.start:c.end]
            cols["doc_key"].append(f"{d['doc_key'][i]}#{j}")
            cols["file_key"].append(d["doc_key"][i])
            cols["source"].append(d["source"][i])
            cols["path"].append(d["path"][i])
            cols["revision"].append(d["archive_sha256"][i])
            cols["language"].append(d["language"][i])
            cols["license_class"].append(d["license_class"][i])
            cols["chunk_index"].append(j)
            cols["n_chunks"].append(len(chunks))
            cols["start"].append(c.start)
            cols["end"].append(c.end)
            cols["kind"].append(c.kind)
            cols["name"].append(c.name)
            cols["n_text_tokens"].append(c.n_tokens)
            cols["bucket"].append(chunk.bucket_for(c.n_tokens + 1))
            cols["text"].append(doc_text)
            if enriching:
                te = time.perf_counter()
                override = lane_edges.get(d["doc_key"][i])
                de = enrich.document_enrichment(fe, c.start, c.end, override)
                lane_docs += override is not None
                cols["char_chunk_boundaries"].append(de.chunks)
                cols["call_edges"].append(de.call_edges)
                cols["type_edges"].append(de.type_edges)
                cols["platform_ids"].append(platforms.scan_platforms(doc_text))
                for name, plane in de.planes.items():
                    cols[f"char_{name}"].append(plane)
                enrich_seconds += time.perf_counter() - te
    table = pa.table(cols, schema=schema)
    out = layout.stage_dir("documents") / "chunks.parquet"
    write_parquet(table, out)
    n_tokens = np.asarray(cols["n_text_tokens"], dtype=np.int64)
    buckets = np.asarray(cols["bucket"], dtype=np.int64)
    over_bucket = int(np.sum(n_tokens + 1 > buckets))
    figures = {"files": kept.num_rows, "documents": table.num_rows, "files_split": split_files, "budget_tokens": budget,
               "max_document_tokens": int(n_tokens.max(initial=0)), "parse_error_files": parse_errors,
               "brace_fallback_files": brace_files,
               "brace_fallback_rate": round(brace_files / max(1, kept.num_rows), 4),
               "fallback_splits": fallback, "kinds": value_counts(table.column("kind")),
               "buckets": {str(k): int(v) for k, v in zip(*np.unique(buckets, return_counts=True))},
               "documents_over_bucket": over_bucket, "tokenizer_sha256": info["sha256"],
               "enrichment": enriching}
    if enriching:
        from . import ast_types

        figures.update({
            "enrichment_version": enrich.ENRICHMENT_VERSION, "enrich_seconds": round(enrich_seconds, 3),
            "ast_node_type_map": ast_types.NODE_TYPE_MAP_VERSION, "ast_node_type_map_sha256": ast_types.map_sha256(),
            "platform_vocabulary": platforms.VOCAB_VERSION, "platform_vocabulary_sha256": platforms.load_vocabulary().sha256,
            "chunks": int(sum(len(x) for x in cols["char_chunk_boundaries"])),
            "call_edges": int(sum(len(x) for x in cols["call_edges"])),
            "type_edges": int(sum(len(x) for x in cols["type_edges"])),
            "platform_labels": platforms.figures(cols["platform_ids"]),
            **lane_figs, "documents_with_semantic_edges": lane_docs,
        })
    res = StageResult("chunk", {"documents": str(out)}, figures)
    res.checks["budgets_hold"] = (figures["max_document_tokens"] <= budget and over_bucket == 0,
                                  f"max {figures['max_document_tokens']} ≤ {budget}; {over_bucket} documents over their bucket")
    from megacpp_checks.schemas import documents as documents_schema

    res.checks["documents_schema"] = documents_schema.validate_documents(table)
    return _timed(layout, "chunk", None, t0, res)


# --------------------------------------------------------------------------- stage 7

def run_chunk_dedup(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Drop duplicate whitelisted chunks; write ``documents/deduped.parquet`` and drops."""
    t0 = time.perf_counter()
    docs = read_parquet(layout.stage_dir("documents") / "chunks.parquet")
    kept, drops, figures = chunk_dedup.dedup_chunks(docs)
    out = layout.stage_dir("documents")
    write_parquet(kept, out / "deduped.parquet")
    write_parquet(drops, out / "chunk_drops.parquet")
    res = StageResult("chunk_dedup", {"documents": str(out / "deduped.parquet"), "drops": str(out / "chunk_drops.parquet")}, figures)
    bad = set(figures["dropped"]) - chunk_dedup.WHITELIST
    res.checks["only_whitelisted_kinds_dropped"] = (not bad, f"dropped kinds {sorted(figures['dropped'])}")
    return _timed(layout, "chunk_dedup", None, t0, res)


# --------------------------------------------------------------------------- stage 8

def run_tokenize(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """BOS + uint32 ids for every document; write ``tokenized/documents.parquet``."""
    t0 = time.perf_counter()
    tok, info = _load_snapshot_tokenizer(layout)
    chunk_figs = layout.read_figures("chunk") or {}
    try:
        tokenize.check_tokenizer(tok, info, vocab_size=manifest.settings.vocab_size,
                                 pinned_sha256=(manifest.tokenizer or {}).get("sha256"),
                                 upstream_sha256=chunk_figs.get("tokenizer_sha256"))
    except tk.TokenizerMismatchError as e:
        raise StageError(f"tokenize refuses the snapshot tokenizer: {e}") from e
    docs = read_parquet(layout.stage_dir("documents") / "deduped.parquet")
    table, figures = tokenize.tokenize_documents(docs, tok, info["vocab_size"])
    if "char_structure" in table.column_names:
        table, align_figs = align_enrichment(table, tok, info["sha256"])
        figures.update(align_figs)
    too_long = pc.sum(pc.greater(table.column("n_tokens"), manifest.settings.row_length)).as_py() or 0
    if too_long:
        raise StageError(f"{too_long} documents exceed the row length {manifest.settings.row_length} with BOS")
    table = table.replace_schema_metadata(None)
    out = write_parquet(table, layout.stage_dir("tokenized") / "documents.parquet")
    figures["tokenizer_sha256"] = info["sha256"]
    figures["vocab_size"] = info["vocab_size"]
    res = StageResult("tokenize", {"documents": str(out)}, figures)
    back = read_parquet(out, columns=["input_ids"]).column("input_ids").combine_chunks()
    firsts = pc.list_element(back, 0) if len(back) else pa.array([], pa.uint32())
    bos_ok = len(back) == 0 or pc.all(pc.equal(firsts, tk.BOS_ID)).as_py()
    max_id = pc.max(back.flatten()).as_py() if len(back) else 0
    res.checks["bos_first_ids_in_vocab_round_trip"] = (bool(bos_ok) and max_id < info["vocab_size"],
                                                       f"{len(back)} documents read back; BOS first: {bos_ok}; max id {max_id} < {info['vocab_size']}")
    from megacpp_checks.schemas import documents as documents_schema

    res.checks["tokenized_schema"] = documents_schema.validate_tokenized(read_parquet(out), tk.BOS_ID)
    return _timed(layout, "tokenize", None, t0, res)


TOKEN_ENRICHED_COLUMNS = pa.schema([
    ("token_char_start", pa.list_(pa.int32())), ("token_char_end", pa.list_(pa.int32())),
    *[(p, pack.OPTIONAL_TYPES[p]) for p in pack.PLANES],
    ("chunk_boundaries", pack.OPTIONAL_TYPES["chunk_boundaries"]),
])


def align_enrichment(table: pa.Table, tok, tokenizer_sha256: str) -> tuple[pa.Table, dict]:
    """Replace the stage-6 character-level columns of tokenized documents by token-aligned
    ones (:func:`megacpp_core.tokenize.align_document`): ``token_char_start/end``, the five
    planes, ``chunk_boundaries`` in token positions and re-indexed edges. Fails closed with
    :class:`StageError` naming the document on any misalignment. Figures: the share of
    tokens per StructureCategory and the chunks dropped for holding no token start."""
    table_bytes, lengths = tokenize.byte_table(tok, tokenizer_sha256)
    d = table.select(["doc_key", "text", "char_chunk_boundaries", "call_edges", "type_edges",
                      *tokenize.CHAR_PLANES]).to_pydict()
    ids_col = table.column("input_ids").combine_chunks()
    offsets = ids_col.offsets.to_numpy()
    flat = ids_col.values.to_numpy(zero_copy_only=False)
    new: dict[str, list] = {f.name: [] for f in TOKEN_ENRICHED_COLUMNS}
    new["call_edges"], new["type_edges"] = [], []
    counts = np.zeros(len(chunk.StructureCategory), dtype=np.int64)
    dropped = 0
    for i, key in enumerate(d["doc_key"]):
        ids = flat[offsets[i]:offsets[i + 1]]
        try:
            spans = tokenize.token_char_spans(d["text"][i], ids, table_bytes, lengths, key)
            al = tokenize.align_document(d["text"][i], ids, spans, {c: d[c][i] for c in tokenize.CHAR_PLANES},
                                         d["char_chunk_boundaries"][i], d["call_edges"][i], d["type_edges"][i], key)
        except tokenize.AlignmentError as e:
            raise StageError(f"tokenize: enrichment alignment failed closed: {e}") from e
        new["token_char_start"].append(spans[0])
        new["token_char_end"].append(spans[1])
        for p in pack.PLANES:
            new[p].append(al[p])
        new["chunk_boundaries"].append(al["chunk_boundaries"])
        new["call_edges"].append(al["call_edges"])
        new["type_edges"].append(al["type_edges"])
        dropped += len(d["char_chunk_boundaries"][i]) - len(al["chunk_boundaries"])
        counts += np.bincount(al["structure_ids"][1:], minlength=len(counts))[:len(counts)]
    table = table.drop_columns(["char_chunk_boundaries", "call_edges", "type_edges", *tokenize.CHAR_PLANES])
    for f in TOKEN_ENRICHED_COLUMNS:
        vals = new[f.name]
        if pa.types.is_list(f.type) and not pa.types.is_struct(f.type.value_type):
            arr = _list_array([np.asarray(v) for v in vals], f.type)
        else:
            arr = pa.array(vals, type=f.type)
        table = table.append_column(f, arr)
    for e in pack.EDGE_COLUMNS:
        table = table.append_column(pa.field(e, pack.OPTIONAL_TYPES[e]), pa.array(new[e], type=pack.OPTIONAL_TYPES[e]))
    total = max(1, int(counts.sum()))
    figures = {"structure_token_share": {c.name: round(int(counts[c]) / total, 4) for c in chunk.StructureCategory},
               "chunks_without_tokens": int(dropped),
               "token_chunks": int(sum(len(x) for x in new["chunk_boundaries"]))}
    return table, figures


def _list_array(values: list[np.ndarray], typ: pa.ListType) -> pa.Array:
    """A list array from numpy arrays in one concatenation (no per-element Python objects)."""
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    np_type = typ.value_type.to_pandas_dtype()
    flat = np.concatenate(values).astype(np_type, copy=False) if values else np.zeros(0, dtype=np_type)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=typ.value_type))


# --------------------------------------------------------------------------- stage 9

_BASE_PACK_COLUMNS = ["doc_key", "source", "revision", "path", "chunk_index", "input_ids"]


def _check_tokenized_lineage(layout: SnapshotLayout, info: dict) -> None:
    """Refuse tokenized documents made with another tokenizer than the snapshot's
    (``figures/tokenize.json`` records the tokenizer sha256). Raises
    :class:`pack.TokenizerMismatchError` naming both hashes."""
    figs = layout.read_figures("tokenize") or {}
    pack.check_tokenizer({"tokenizer_sha256": figs.get("tokenizer_sha256")}, info["sha256"], None,
                         str(layout.stage_dir("tokenized") / "documents.parquet"))


def fim_config(manifest: Manifest):
    """The snapshot's :class:`megacpp_core.fim.FimConfig` from its settings."""
    from . import fim

    s = manifest.settings
    return fim.FimConfig(rate=s.fim_rate, spm_share=s.fim_spm_share, seed=s.fim_seed,
                         doc_comment_policy=s.fim_doc_comment_policy)


def read_pack_inputs(layout: SnapshotLayout) -> tuple[list[pack.PackInput], list[str], pa.Table]:
    """The tokenized documents as :class:`pack.PackInput` (tokenized order), the optional
    enrichment columns they carry, and the raw table (``doc_key``, ``text``, ``input_ids``)."""
    import pyarrow.parquet as pq

    path = layout.stage_dir("tokenized") / "documents.parquet"
    names = pq.read_schema(path).names
    optional = [c for c in pack.OPTIONAL_COLUMNS if c in names]
    docs = read_parquet(path, columns=_BASE_PACK_COLUMNS + ["text"] + optional)
    ids = docs.column("input_ids").combine_chunks()
    offsets = ids.offsets.to_numpy()
    flat = ids.values.to_numpy(zero_copy_only=False).astype(np.uint32, copy=False)
    planes = [c for c in optional if c in pack.PLANES]
    flat_planes = {}
    for c in planes:  # slice planes from one flat array instead of building Python lists
        col = docs.column(c).combine_chunks()
        flat_planes[c] = (col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False))
    d = docs.select([c for c in _BASE_PACK_COLUMNS if c != "input_ids"] + [c for c in optional if c not in planes]).to_pydict()
    inputs = []
    for i in range(docs.num_rows):
        extras = {c: d[c][i] for c in optional if c not in flat_planes}
        for c, (offs, vals) in flat_planes.items():
            extras[c] = vals[offs[i]:offs[i + 1]]
        inputs.append(pack.PackInput(flat[offsets[i]:offsets[i + 1]], d["doc_key"][i], d["source"][i], d["revision"][i],
                                     d["path"][i], d["chunk_index"][i], extras=extras))
    return inputs, optional, docs.select(["doc_key", "text", "input_ids"])


def apply_snapshot_fim(inputs: list[pack.PackInput], texts: list[str], manifest: Manifest, tok,
                       tokenizer_sha256: str | None = None) -> tuple[list[pack.PackInput], dict]:
    """FIM over pack inputs with the snapshot's settings (deterministic by seed and doc key)."""
    from . import fim

    cfg = fim_config(manifest)
    table, lengths = tokenize.byte_table(tok, tokenizer_sha256) if cfg.rate > 0 and cfg.doc_comment_policy == "mask" else (None, None)
    return fim.apply_fim_all(inputs, cfg, manifest.settings.row_length, table, lengths,
                             texts if table is not None else None)


def packed_documents(layout: SnapshotLayout, manifest: Manifest, tok,
                     tokenizer_sha256: str | None = None) -> tuple[list[pack.PackInput], list[str], dict, pa.Table]:
    """The tokenized documents as :class:`pack.PackInput` after FIM (deterministic by seed
    and doc key), the optional enrichment columns they carry, FIM figures and the raw table
    (``doc_key``, ``text``, ``input_ids``, tokenized order)."""
    inputs, optional, raw = read_pack_inputs(layout)
    inputs, figs = apply_snapshot_fim(inputs, raw.column("text").to_pylist(), manifest, tok, tokenizer_sha256)
    return inputs, optional, figs, raw


def run_pack(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """FIM, then best-fit-decreasing packing into ``row_length`` rows; write ``packed/`` + ``_SUCCESS``.

    Refuses (:class:`pack.TokenizerMismatchError`) tokenized documents made with another
    tokenizer; the producer asserts the row contract before writing
    (:class:`pack.RowContractError`), the gate re-reads every shard after.
    """
    t0 = time.perf_counter()
    tok, info = _load_snapshot_tokenizer(layout)
    _check_tokenized_lineage(layout, info)
    s = manifest.settings
    inputs, optional, fim_figs, _ = packed_documents(layout, manifest, tok, info["sha256"])
    t_pack = time.perf_counter()
    rows = pack.build_rows(inputs, s.row_length, tk.BOS_ID, tk.PAD_ID, optional=optional)
    pack_seconds = time.perf_counter() - t_pack
    summary = pack.check_rows(rows, s.row_length, info["vocab_size"], tk.BOS_ID, tk.PAD_ID, where="packed rows")
    total = summary["tokens"]
    lower = -(-total // s.row_length)
    sentinel = pack.write_shards(rows, layout.stage_dir("packed"), row_length=s.row_length, vocab_size=info["vocab_size"],
                                 tokenizer_sha256=info["sha256"], validation_fraction=s.validation_fraction,
                                 max_docs_per_shard=s.max_docs_per_shard,
                                 extra={"snapshot": manifest.name, "rows_lower_bound": lower,
                                        "fim": dict(fim_figs)})
    figures = {**summary, "row_length": s.row_length, "rows_lower_bound": lower,
               "rows_over_lower_bound": round(summary["rows"] / max(1, lower), 4),
               "validation_rows": sentinel["validation_rows"], "files": len(sentinel["files"]),
               "optional_columns": optional, "packing_seconds": round(pack_seconds, 4),
               "tokenizer_sha256": info["sha256"], **fim_figs}
    res = StageResult("pack", {"packed": str(layout.stage_dir("packed"))}, figures)
    from megacpp_checks.packed import verify_packed_dir  # re-read every shard from disk

    gate = verify_packed_dir(layout.stage_dir("packed"), out=lambda m: None,
                             tokenizer_sha256=info["sha256"], vocab_size=info["vocab_size"])
    res.checks["row_contract"] = (gate.ok, "; ".join(gate.failures) or f"{gate.figures['rows']} rows re-read and valid (SPEC §6, pandera)")
    return _timed(layout, "pack", None, t0, res)


# --------------------------------------------------------------------------- stage 10

def megatron_prefix(layout: SnapshotLayout, manifest: Manifest) -> Path:
    """``megatron/SNAPSHOT_text_document`` (Megatron's conventional suffix)."""
    return layout.stage_dir("megatron") / f"{manifest.name}_text_document"


EXPORT_LEVELS = ("document", "row")


def run_format(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Write Megatron ``.bin/.idx`` and run the verify gate (SPEC §7).

    ``settings.megatron_export``: ``"document"`` (default) writes one sequence per document
    exactly as it enters the rows (after FIM, tokenized order); ``"row"`` writes every packed
    row (all L tokens, train then validation) as one sequence, for ``GPTDataset`` with
    ``sequence_length = L`` and ``add_extra_token_to_sequence=False``. Refuses packed rows
    made with another tokenizer (:class:`pack.TokenizerMismatchError`).
    """
    import pyarrow.parquet as pq

    from megacpp_checks import verify  # the gate lives with the checks

    t0 = time.perf_counter()
    tok, info = _load_snapshot_tokenizer(layout)
    level = manifest.settings.megatron_export
    if level not in EXPORT_LEVELS:
        raise StageError(f"settings.megatron_export {level!r} not in {EXPORT_LEVELS}")
    packed = layout.stage_dir("packed")
    sentinel = pack.read_success(packed, tokenizer_sha256=info["sha256"], vocab_size=info["vocab_size"])
    prefix = megatron_prefix(layout, manifest)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    if level == "document":
        inputs, _, _, raw = packed_documents(layout, manifest, tok, info["sha256"])
        texts = raw.column("text").to_pylist()
        seqs = [d.ids for d in inputs]
        keys = [d.doc_key for d in inputs]
        texts = [t if len(q) == len(raw_ids) else tk.decode(tok, q[1:])
                 for t, q, raw_ids in zip(texts, seqs, raw.column("input_ids").to_pylist())]
    else:
        seqs, keys = [], []
        for f in sentinel["files"]:
            t = pq.read_table(packed / f["file"], columns=["pack_id", "input_ids"])
            seqs += [np.asarray(x, dtype=np.uint32) for x in t.column("input_ids").to_pylist()]
            keys += [f"row-{p}" for p in t.column("pack_id").to_pylist()]
        texts = [tk.decode(tok, q[1:]) for q in seqs]
    written = megatron.write_indexed_dataset(prefix, iter(seqs), info["vocab_size"])
    doc_table = pa.table({"doc_key": keys, "text": pa.array(texts, pa.large_string())})
    write_parquet(doc_table, prefix.parent / f"{prefix.name}.documents.parquet")
    tok_dst = prefix.parent / "tokenizer.json"
    shutil.copyfile(layout.stage_dir("tokenizer") / "tokenizer.json", tok_dst)
    verify.write_sidecar(prefix, vocab_size=info["vocab_size"], tokenizer_path=tok_dst, tokenizer_sha256=info["sha256"],
                         documents_path=prefix.parent / f"{prefix.name}.documents.parquet",
                         extra={"export_level": level, "row_length": manifest.settings.row_length})
    lines: list[str] = []
    report = verify.verify_megatron(prefix, out=lines.append, tokenizer_sha256=info["sha256"], vocab_size=info["vocab_size"])
    figures = {**written, "prefix": str(prefix), "export_level": level, "verify_ok": report.ok,
               "verify_failures": report.failures, "first_tokens": lines[-2:] if lines else []}
    res = StageResult("format", {"prefix": str(prefix)}, figures)
    res.checks["verify_gate"] = (report.ok, "; ".join(report.failures) or "verify passed")
    if not report.ok:
        raise StageError(f"verify gate failed for {prefix}: {'; '.join(report.failures)}")
    return _timed(layout, "format", None, t0, res)
