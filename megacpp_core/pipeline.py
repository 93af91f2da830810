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

from . import acquire, chunk, chunk_dedup, dedup, license, megatron, pack, quality, scrub, tokenize
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
    """Fetch (or reuse) the pinned archive and write ``revisions/SOURCE/source_files.parquet``."""
    t0 = time.perf_counter()
    archive = acquire.fetch_pypi_sdist(source, layout.cache)
    table = acquire.source_files_table(manifest.name, source, archive)
    out = write_parquet(table, layout.revision(source.name) / "source_files.parquet")
    figures = {
        "source": source.name, "kind": source.kind, "version": source.version,
        "archive": archive.filename, "archive_sha256": archive.sha256, "from_cache": archive.from_cache,
        "files": table.num_rows, "bytes": int(pc.sum(table.column("size")).as_py() or 0),
        "languages": value_counts(table.column("language")),
    }
    res = StageResult("acquire", {"source_files": str(out)}, figures)
    res.checks["hash_matches_pin"] = (archive.sha256 == source.sha256, f"sha256 {archive.sha256}")
    return _timed(layout, "acquire", source.name, t0, res)


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
    return license.LicensePolicy(unknown_decision=manifest.settings.license_unknown_decision,
                                 refused_sources=frozenset(manifest.settings.refused_sources))


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
        cols["archive_sha256"].append(source.sha256)
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
    return _timed(layout, "scrub", source.name, t0, res)


# --------------------------------------------------------------------------- stage 4

def _snapshot_scrubbed(layout: SnapshotLayout, manifest: Manifest) -> pa.Table:
    tables = [read_parquet(layout.revision(s.name) / "scrubbed.parquet") for s in manifest.sources]
    return pa.concat_tables(tables)


def run_dedup(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Exact then near dedup across every source; write ``dedup/decisions.parquet`` and ``dedup/kept.parquet``."""
    t0 = time.perf_counter()
    s = manifest.settings
    docs = _snapshot_scrubbed(layout, manifest)
    d = docs.to_pydict()
    records = [dedup.DedupRecord(doc_key=d["doc_key"][i], source=d["source"][i], source_order=d["source_order"][i],
                                 path=d["path"][i], license_class=d["license_class"][i], text=d["text"][i])
               for i in range(docs.num_rows)]
    result = dedup.deduplicate(records, num_perm=s.minhash_num_perm, threshold=s.minhash_threshold, shingle_k=s.shingle_k)
    decisions = pa.Table.from_pylist(result.decisions)
    out_dir = layout.stage_dir("dedup")
    write_parquet(decisions, out_dir / "decisions.parquet")
    keep = {r["doc_key"] for r in result.decisions if r["keep"]}
    kept = docs.filter(pa.array([k in keep for k in d["doc_key"]]))
    # keep order for every later stage: license rank, source order, path
    k = kept.select(["license_class", "source_order", "path"]).to_pydict()
    order = sorted(range(kept.num_rows), key=lambda i: (dedup.LICENSE_RANK[k["license_class"][i]], k["source_order"][i], k["path"][i]))
    kept = kept.take(pa.array(order, type=pa.int64()))
    write_parquet(kept, out_dir / "kept.parquet")
    figures = dict(result.figures)
    figures["bytes_out"] = int(sum(len(t.encode("utf-8")) for t in kept.column("text").to_pylist()))
    drops = [r for r in result.decisions if not r["keep"]]
    res = StageResult("dedup", {"decisions": str(out_dir / "decisions.parquet"), "kept": str(out_dir / "kept.parquet")}, figures)
    twins_ok = all(r["kept_twin"] in keep for r in drops)
    res.checks["each_drop_names_kept_twin"] = (twins_ok, f"{len(drops)} drops")
    return _timed(layout, "dedup", None, t0, res)


# --------------------------------------------------------------------------- stage 5

def run_tokenizer(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Train the BPE tokenizer on the deduplicated snapshot; write ``tokenizer/``."""
    t0 = time.perf_counter()
    kept = read_parquet(layout.stage_dir("dedup") / "kept.parquet", columns=["doc_key", "text"])
    texts = kept.column("text").to_pylist()
    build = tk.train_tokenizer(texts, vocab_size=manifest.settings.vocab_size)
    out_dir = layout.stage_dir("tokenizer")
    info = tk.save_tokenizer(build, out_dir, extra={"snapshot": manifest.name})
    tok = tk.load_tokenizer(out_dir / "tokenizer.json", info["tokenizer_sha256"])
    failures = tk.check_round_trip(tok, zip(kept.column("doc_key").to_pylist(), texts))
    if failures:
        raise StageError(f"tokenizer round trip fails on {len(failures)} documents, first {failures[0]}")
    ok_ids = all(tok.token_to_id(t) == i for i, t in enumerate(tk.SPECIAL_TOKENS))
    figures = {"vocab_size": build.vocab_size, "learned": build.learned, "reserved": build.reserved,
               "sha256": info["tokenizer_sha256"], "bands": build.bands, "training_documents": len(texts)}
    res = StageResult("tokenizer", {"tokenizer": str(out_dir / "tokenizer.json")}, figures)
    res.checks["vocab_size_exact"] = (tok.get_vocab_size(with_added_tokens=True) == manifest.settings.vocab_size,
                                      f"{tok.get_vocab_size(with_added_tokens=True)} ids")
    res.checks["fixed_special_ids"] = (ok_ids, "special tokens at ids 0-63")
    res.checks["round_trip_every_document"] = (not failures, f"{len(texts) - len(failures)}/{len(texts)} documents round-trip exactly")
    return _timed(layout, "tokenizer", None, t0, res)


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
    ("kind", pa.string()), ("name", pa.string()), ("n_text_tokens", pa.int32()), ("text", pa.large_string()),
])


def run_chunk(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Split every kept file at function/class boundaries under ``row_length - 1`` tokens
    (one slot is the document's BOS); write ``documents/chunks.parquet``."""
    t0 = time.perf_counter()
    tok, info = _load_snapshot_tokenizer(layout)
    budget = manifest.settings.row_length - 1
    kept = read_parquet(layout.stage_dir("dedup") / "kept.parquet")
    d = kept.to_pydict()
    cols = {f.name: [] for f in DOCUMENTS_SCHEMA}
    parse_errors = fallback = split_files = 0
    counter = lambda text: tk.count_tokens(tok, text)
    for i in range(kept.num_rows):
        text = d["text"][i]
        chunks, stats = chunk.split_document_with_stats(text, d["language"][i], counter, budget, d["doc_key"][i])
        parse_errors += bool(stats.get("parse_errors"))
        fallback += int(stats.get("fallback_splits", 0))
        split_files += len(chunks) > 1
        for j, c in enumerate(chunks):
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
            cols["text"].append(text[c.start:c.end])
    table = pa.table(cols, schema=DOCUMENTS_SCHEMA)
    out = layout.stage_dir("documents") / "chunks.parquet"
    write_parquet(table, out)
    figures = {"files": kept.num_rows, "documents": table.num_rows, "files_split": split_files, "budget_tokens": budget,
               "max_document_tokens": int(max(cols["n_text_tokens"], default=0)), "parse_error_files": parse_errors,
               "fallback_splits": fallback, "kinds": value_counts(table.column("kind"))}
    res = StageResult("chunk", {"documents": str(out)}, figures)
    res.checks["budgets_hold"] = (figures["max_document_tokens"] <= budget, f"max {figures['max_document_tokens']} ≤ {budget}")
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
    docs = read_parquet(layout.stage_dir("documents") / "deduped.parquet")
    table, figures = tokenize.tokenize_documents(docs, tok, info["vocab_size"])
    too_long = pc.sum(pc.greater(table.column("n_tokens"), manifest.settings.row_length)).as_py() or 0
    if too_long:
        raise StageError(f"{too_long} documents exceed the row length {manifest.settings.row_length} with BOS")
    table = table.replace_schema_metadata(None)
    out = write_parquet(table, layout.stage_dir("tokenized") / "documents.parquet")
    figures["tokenizer_sha256"] = info["sha256"]
    res = StageResult("tokenize", {"documents": str(out)}, figures)
    back = read_parquet(out, columns=["input_ids"]).column("input_ids").combine_chunks()
    firsts = pc.list_element(back, 0) if len(back) else pa.array([], pa.uint32())
    bos_ok = len(back) == 0 or pc.all(pc.equal(firsts, tk.BOS_ID)).as_py()
    max_id = pc.max(back.flatten()).as_py() if len(back) else 0
    res.checks["bos_first_ids_in_vocab_round_trip"] = (bool(bos_ok) and max_id < info["vocab_size"],
                                                       f"{len(back)} documents read back; BOS first: {bos_ok}; max id {max_id} < {info['vocab_size']}")
    return _timed(layout, "tokenize", None, t0, res)


# --------------------------------------------------------------------------- stage 9

def run_pack(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Best-fit-decreasing packing into ``row_length`` rows; write ``packed/`` + ``_SUCCESS``."""
    t0 = time.perf_counter()
    _, info = _load_snapshot_tokenizer(layout)
    s = manifest.settings
    docs = read_parquet(layout.stage_dir("tokenized") / "documents.parquet",
                        columns=["doc_key", "source", "revision", "path", "chunk_index", "input_ids"])
    d = docs.to_pydict()
    inputs = [pack.PackInput(np.asarray(d["input_ids"][i], dtype=np.uint32), d["doc_key"][i], d["source"][i],
                             d["revision"][i], d["path"][i], d["chunk_index"][i]) for i in range(docs.num_rows)]
    rows = pack.build_rows(inputs, s.row_length, tk.BOS_ID, tk.PAD_ID)
    summary = pack.check_rows(rows, s.row_length, info["vocab_size"], tk.BOS_ID, tk.PAD_ID, where="packed rows")
    sentinel = pack.write_shards(rows, layout.stage_dir("packed"), row_length=s.row_length, vocab_size=info["vocab_size"],
                                 tokenizer_sha256=info["sha256"], validation_fraction=s.validation_fraction,
                                 max_docs_per_shard=s.max_docs_per_shard, extra={"snapshot": manifest.name})
    total = summary["tokens"]
    lower = -(-total // s.row_length)
    figures = {**summary, "row_length": s.row_length, "rows_lower_bound": lower,
               "rows_over_lower_bound": round(summary["rows"] / max(1, lower), 4),
               "validation_rows": sentinel["validation_rows"], "files": len(sentinel["files"])}
    res = StageResult("pack", {"packed": str(layout.stage_dir("packed"))}, figures)
    from megacpp_checks.packed import verify_packed_dir  # re-read every shard from disk

    gate = verify_packed_dir(layout.stage_dir("packed"), out=lambda m: None)
    res.checks["row_contract"] = (gate.ok, "; ".join(gate.failures) or f"{gate.figures['rows']} rows re-read and valid (SPEC §6)")
    return _timed(layout, "pack", None, t0, res)


# --------------------------------------------------------------------------- stage 10

def megatron_prefix(layout: SnapshotLayout, manifest: Manifest) -> Path:
    """``megatron/SNAPSHOT_text_document`` (Megatron's conventional suffix)."""
    return layout.stage_dir("megatron") / f"{manifest.name}_text_document"


def run_format(layout: SnapshotLayout, manifest: Manifest) -> StageResult:
    """Write Megatron ``.bin/.idx`` (one sequence per document) and run the verify gate."""
    from megacpp_checks import verify  # the gate lives with the checks

    t0 = time.perf_counter()
    _, info = _load_snapshot_tokenizer(layout)
    docs = read_parquet(layout.stage_dir("tokenized") / "documents.parquet", columns=["doc_key", "text", "input_ids"])
    prefix = megatron_prefix(layout, manifest)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    ids = docs.column("input_ids").to_pylist()
    written = megatron.write_indexed_dataset(prefix, (np.asarray(x, dtype=np.uint32) for x in ids), info["vocab_size"])
    doc_table = docs.select(["doc_key", "text"])
    write_parquet(doc_table, prefix.parent / f"{prefix.name}.documents.parquet")
    tok_dst = prefix.parent / "tokenizer.json"
    shutil.copyfile(layout.stage_dir("tokenizer") / "tokenizer.json", tok_dst)
    verify.write_sidecar(prefix, vocab_size=info["vocab_size"], tokenizer_path=tok_dst, tokenizer_sha256=info["sha256"],
                         documents_path=prefix.parent / f"{prefix.name}.documents.parquet")
    lines: list[str] = []
    report = verify.verify_megatron(prefix, out=lines.append)
    figures = {**{k: v for k, v in written.items()}, "prefix": str(prefix), "verify_ok": report.ok,
               "verify_failures": report.failures, "first_tokens": lines[-2:] if lines else []}
    res = StageResult("format", {"prefix": str(prefix)}, figures)
    res.checks["verify_gate"] = (report.ok, "; ".join(report.failures) or "verify passed")
    if not report.ok:
        raise StageError(f"verify gate failed for {prefix}: {'; '.join(report.failures)}")
    return _timed(layout, "format", None, t0, res)
