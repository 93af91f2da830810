"""Curriculum families — one snapshot stage per family (SPEC §5b): its packed rows and its
Megatron dataset, each behind its own blocking gate.

Per snapshot, from the family's documents (:data:`megacpp_core.catalog.FAMILY_DOCUMENTS`):
the rows are packed best-fit decreasing at the family's row length, streamed one packing
group at a time (:mod:`megacpp_core.pack_stream`, the same code as stage 9), and the
document-level Megatron export writes every document as it enters the rows
(:func:`megacpp_core.megatron_export.document_level`), ``SNAPSHOT_FAMILY_text_document``.
FIM follows the snapshot's settings for the phase-1 and phase-2 families and is off for
repository documents (:attr:`megacpp_core.families.Family.fim`); the phase-1 families leave out the pieces of
the chunk-level dedup drops (:func:`piece_drops`), as stage 9 does. Gates: the row contract on
every committed row (SPEC §6, pandera) and the verify gate on the committed ``.bin/.idx``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_checks import verify
from megacpp_checks.packed import verify_packed_dir

from .. import catalog, families, family_documents, fim, megatron_export, pack, pack_stream, plots, snapshot_tokenizer
from ..stage import Files, Partitioning, Result, Shards, Stage, StageError
from ..tables import ParquetStream, read_parquet, release_memory, sha256_file

#: Settings of every family stage; a family with FIM also reads :data:`FIM_SETTINGS`.
SETTINGS = ("validation_fraction", "max_docs_per_shard", "pack_group_tokens")
FIM_SETTINGS = ("fim_rate", "fim_spm_share", "fim_seed", "fim_doc_comment_policy")
#: Bins of the document-length histogram in the figures (tokens, BOS included): powers of two.
LENGTH_BINS = tuple(2 ** k for k in range(4, 18))


class FamilySettings:
    """The stage's settings with the family's ``row_length``; for a family without FIM,
    ``fim_rate`` 0 and :class:`megacpp_core.fim.FimConfig`'s defaults for the other FIM
    settings (which it then does not read): what :mod:`megacpp_core.pack_stream` and the
    export read."""

    def __init__(self, settings, family: families.Family):
        self._settings, self.row_length = settings, family.row_length
        d = fim.FimConfig()
        self._off = None if family.fim else {"fim_rate": 0.0, "fim_spm_share": d.spm_share, "fim_seed": d.seed,
                                             "fim_doc_comment_policy": d.doc_comment_policy}

    def __getattr__(self, name: str):
        if self._off is not None and name in self._off:
            return self._off[name]
        return getattr(self._settings, name)


def length_histogram(refs) -> dict[str, int]:
    """``{"≤N": documents}`` over :data:`LENGTH_BINS` of the family's document lengths."""
    n = np.concatenate([r.read(columns=["n_tokens"]).column("n_tokens").to_numpy() for r in refs] or [np.zeros(0, np.int32)])
    at = np.searchsorted(np.asarray(LENGTH_BINS), n, side="left")
    counts = np.bincount(at, minlength=len(LENGTH_BINS))
    return {f"<={b}": int(c) for b, c in zip(LENGTH_BINS, counts) if c}


def _compute(family: families.Family, ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    docs = catalog.FAMILY_DOCUMENTS[family.name]
    refs = ctx.inputs(docs.name)
    for ref in refs:
        pack.check_tokenizer({"tokenizer_sha256": ref.metadata().get("tokenizer_sha256")}, info["sha256"], None, ref.uri)
    s = FamilySettings(ctx.settings, family)
    order = {src.name: i for i, src in enumerate(ctx.sources)}
    drops = piece_drops(refs, ctx.input("chunk_drops")) if family.phase == 1 else pa.array([], pa.string())
    p = pack_stream.plan(refs, order, drops, s, group_tokens=ctx.settings.pack_group_tokens)
    if not p.rows:
        raise StageError(f"family {family.name} has no documents in snapshot {ctx.snapshot}")
    ctx.log(f"{family.name}: {p.docs.num_rows} documents in {len(p.groups)} packing group(s) → {p.rows} rows of {s.row_length}")
    files, summary, fim_figs, optional = pack_stream.write_rows(p, refs, order, s, tok, info["sha256"], info["vocab_size"],
                                                                ctx.workdir(f"{family.name}-packed-"))
    lower = -(-summary["tokens"] // s.row_length)
    valid = [read_parquet(path, columns=["valid_token_count"]).column("valid_token_count").to_numpy() for _, path, _ in files]
    row_fill = plots.row_fill_histogram(np.concatenate(valid) if valid else np.zeros(0, np.int32), s.row_length)
    sentinel = pack.sentinel_fields(p.rows, files, p.validation_rows, row_length=s.row_length, vocab_size=info["vocab_size"],
                                    tokenizer_sha256=info["sha256"], optional=optional,
                                    extra={"snapshot": ctx.snapshot, "family": family.name, "phase": family.phase,
                                           "rows_lower_bound": lower, "fim": dict(fim_figs)})
    name = f"{ctx.snapshot}_{family.name}_text_document"
    d = ctx.workdir(f"{family.name}-megatron-")
    prefix, docs_file = d / name, d / f"{name}.documents.parquet"
    with ParquetStream(docs_file, pa.schema([("doc_key", pa.string()), ("text", pa.large_string())]),
                       whole_row_groups=True, release_each_write=False) as docs_out:  # one row group's buffers, reused
        written = megatron_export.document_level(refs, drops, order, s, tok, info, d, prefix, docs_out,
                                                 batch_docs=megatron_export.EXPORT_BATCH_DOCS)
    release_memory()
    tok_file = d / "tokenizer.json"
    tok_file.write_bytes(ctx.input("tokenizer").read_bytes())
    verify.write_sidecar(prefix, vocab_size=info["vocab_size"], tokenizer_path=tok_file, tokenizer_sha256=info["sha256"],
                         documents_path=docs_file,
                         extra={"export_level": "document", "family": family.name, "phase": family.phase,
                                "row_length": s.row_length, "bin_sha256": written["bin_sha256"],
                                "idx_sha256": written["idx_sha256"], "documents_sha256": sha256_file(docs_file)})
    report = verify.verify_megatron(prefix, out=lambda m: None, tokenizer_sha256=info["sha256"], vocab_size=info["vocab_size"],
                                    tokenizer=tok)
    if not report.ok:
        raise StageError(f"verify gate failed for {name}: {'; '.join(report.failures)}")
    figures = {"family": family.name, "phase": family.phase, "row_length": s.row_length, "docs": summary["docs"],
               "chunk_drops": len(drops),
               "tokens": summary["tokens"], "rows": summary["rows"], "loss_tokens": summary["loss_tokens"],
               "fill": round(summary["tokens"] / (summary["rows"] * s.row_length), 6),
               "rows_lower_bound": lower, "rows_over_lower_bound": round(summary["rows"] / max(1, lower), 4),
               "row_fill": row_fill, "validation_rows": p.validation_rows, "files": len(files), "packing_groups": len(p.groups),
               "optional_columns": optional, "document_lengths": length_histogram(refs),
               "tokens_per_source": _tokens_per_source(refs),
               "megatron_prefix": f"families/{family.name}/megatron/{name}", "sequences": written["sequences"],
               "bin_sha256": written["bin_sha256"], "idx_sha256": written["idx_sha256"], "verify_ok": report.ok,
               "tokenizer_sha256": info["sha256"], "vocab_size": info["vocab_size"], **fim_figs}
    files_out = {q.name: q for q in d.iterdir() if q.is_file()}
    return Result({f"{family.name}_packed": Shards(files, sentinel),
                   f"{family.name}_megatron": Files(files_out, order=(f"{name}.bin", f"{name}.idx", f"{name}.json"))},
                  figures)


def piece_drops(refs, chunk_drops) -> pa.Array:
    """The ``doc_key`` of every phase-1 document that is, or is a piece of, a chunk the
    chunk-level dedup dropped (stage 7; pack and format leave the same chunks out)."""
    drops = chunk_drops.read(columns=["doc_key"]).column("doc_key").combine_chunks()
    if not len(drops):
        return pa.array([], pa.string())
    keys = pa.chunked_array([c for r in refs for c in r.read(columns=["doc_key"]).column("doc_key").chunks], pa.string())
    origin = pc.replace_substring_regex(keys, f"{family_documents.PIECE_SEP}[0-9]+$", "")
    return keys.filter(pc.is_in(origin, value_set=drops)).combine_chunks()


def _tokens_per_source(refs) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in refs:
        t = r.read(columns=["source", "n_tokens"])
        for src, n in zip(t.column("source").to_pylist(), t.column("n_tokens").to_pylist()):
            out[src] = out.get(src, 0) + n
    return dict(sorted(out.items()))


def compute(ctx) -> Result:
    """The family stage's compute; the family is the stage's name (module level, so a
    stage declaration pickles by name for ``megacpp run --workers``)."""
    return _compute(families.BY_NAME[ctx.stage.name], ctx)


def row_contract(g):
    """Every committed shard matches ``_SUCCESS`` and every row passes the row contract
    (SPEC §6) and the pandera schema, at the family's row length."""
    f = g.figures
    gate = verify_packed_dir(g.output(catalog.FAMILY_PACKED[g.ctx.stage.name].name).uri, out=lambda m: None,
                             tokenizer_sha256=f["tokenizer_sha256"], vocab_size=f["vocab_size"])
    return gate.ok, "; ".join(gate.failures) or f"{gate.figures['rows']} rows of {f['row_length']} re-read and valid"


def verify_gate(g):
    """SPEC §7 verify gate on the family's committed ``.bin/.idx`` (document zero decoded
    with the stage's tokenizer when the committed ``tokenizer.json`` has its sha256)."""
    f = g.figures
    stem = f["megatron_prefix"].rsplit("/", 1)[-1]
    with g.output(catalog.FAMILY_MEGATRON[g.ctx.stage.name].name).local() as d:
        report = verify.verify_megatron(d / stem, out=lambda m: None, tokenizer_sha256=f["tokenizer_sha256"],
                                        vocab_size=f["vocab_size"], require_checksums=True,
                                        tokenizer=megatron_export.gate_tokenizer(g.ctx, f["tokenizer_sha256"]))
    return report.ok, "; ".join(report.failures) or "verify passed"


def family_plots(figures: dict) -> dict[str, bytes]:
    """``{FAMILY_lengths_and_fill: PNG}``: the family's document-length and row-fill
    histograms (:func:`megacpp_core.plots.family_plot`), for its asset's metadata."""
    return {f"{figures['family']}_lengths_and_fill": plots.family_plot(figures)}


def _stage(family: families.Family) -> Stage:
    packed, meg = catalog.FAMILY_PACKED[family.name], catalog.FAMILY_MEGATRON[family.name]
    return Stage(
        name=family.name, asset=f"{family.name}_dataset", partitioning=Partitioning.SNAPSHOT, compute=compute,
        code_version="2", kinds=("parquet", "megatron"),
        description=f"Curriculum phase {family.phase} family {family.name} (SPEC 5b): {family.documents}; packed rows of "
                    f"{family.row_length:,} tokens with _SUCCESS and the Megatron .bin/.idx, each behind its gate.",
        inputs=(catalog.FAMILY_DOCUMENTS[family.name], *((catalog.CHUNK_DROPS,) if family.phase == 1 else ()),
                catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST),
        outputs=(packed, meg), settings=SETTINGS + (FIM_SETTINGS if family.fim else ()), gates=(row_contract, verify_gate),
        plots=family_plots,
        figures=("family", "phase", "row_length", "docs", "chunk_drops", "tokens", "rows", "loss_tokens", "fill", "rows_lower_bound",
                 "rows_over_lower_bound", "row_fill", "validation_rows", "files", "packing_groups", "optional_columns",
                 "document_lengths", "tokens_per_source", "megatron_prefix", "sequences", "bin_sha256", "idx_sha256",
                 "verify_ok", "tokenizer_sha256", "vocab_size", "fim_rate", "fim_spm_share", "fim_seed", "fim_psm",
                 "fim_spm", "fim_skipped_too_long", "fim_doc_comment_policy", "fim_doc_comment_masked_tokens",
                 "fim_doc_comment_docs"),
    )


STAGES: tuple[Stage, ...] = tuple(_stage(f) for f in families.FAMILIES if f.name in catalog.FAMILY_DOCUMENTS)
