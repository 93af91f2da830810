"""Stage 10 — the Megatron ``.bin/.idx`` export and its verify gate (SPEC §7).

Per snapshot. Inputs: every shard's ``tokenized`` documents but the ``chunk_drops``
(document-level export, one part per shard), ``packed`` rows
(row-level export; its ``_SUCCESS`` must name the snapshot tokenizer) and the snapshot
``tokenizer``. Output: ``megatron`` — ``SNAPSHOT_text_document.bin/.idx`` (int32 ids via
megatron-core's ``IndexedDatasetBuilder``, or the byte-identical raw writer), the
documents parquet (the text of each sequence), ``tokenizer.json`` and the sidecar
``SNAPSHOT_text_document.json``, committed last. The files are built and verified in local
scratch space (fail closed), then committed; the gate verifies the committed copy again.

``settings.megatron_export``: ``"document"`` (default) writes one sequence per document
exactly as it enters the rows (after FIM), each ``tokenized`` shard as whole arrays
appended to the pair in one write (memory is two shards, the one read and the one a writer
thread appends; the raw writer, byte-identical to megatron-core's
``IndexedDatasetBuilder``; see :func:`megacpp_core.megatron_export.document_level`) —
the same sequences whatever the number of shards, in an order that follows the shards;
``"row"`` writes every packed row (all L tokens, train then validation) as one sequence,
for ``GPTDataset`` with ``sequence_length = L`` and ``add_extra_token_to_sequence=False``.
The verify gate decodes document zero with the stage's own tokenizer when the committed
``tokenizer.json`` has its sha256 (:func:`megacpp_checks.verify.verify_megatron`); the
stage copies the tokenizer bytes it hashed (:func:`megacpp_core.snapshot_tokenizer.load_with_bytes`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from megacpp_checks import verify

from .. import catalog, megatron, megatron_export, pack, pack_inputs, snapshot_tokenizer
from ..stage import Files, Partitioning, Result, Stage, StageError
from ..tables import ParquetStream, release_memory, sha256_file

EXPORT_LEVELS = ("document", "row")
SETTINGS = ("megatron_export", "row_length", "fim_rate", "fim_spm_share", "fim_seed", "fim_doc_comment_policy")


def prefix_name(snapshot: str) -> str:
    """``SNAPSHOT_text_document`` (Megatron's conventional suffix)."""
    return f"{snapshot}_text_document"


def _document_level(ctx, tok, info: dict, d, prefix, docs_out: ParquetStream) -> dict:
    """The document-level export of every ``tokenized`` shard but the chunk drops
    (:func:`megacpp_core.megatron_export.document_level`); each shard must name the
    snapshot tokenizer (checked on the file it is read from:
    :class:`~megacpp_core.pack.TokenizerMismatchError`)."""
    order = {s.name: i for i, s in enumerate(ctx.sources)}
    return megatron_export.document_level(ctx.inputs("tokenized"), pack_inputs.chunk_drops(ctx), order, ctx.settings,
                                          tok, info, d, prefix, docs_out, check_tokenizer=True)


def _row_level(tok, info: dict, packed, sentinel: dict, d, prefix, docs_out: ParquetStream) -> dict:
    """Every packed row (all L tokens, train then validation) as one sequence, one packed
    file at a time, its ids as one flat array (each row's text decoded from its ids but
    the first, :func:`megacpp_core.megatron_export.decoded_texts`)."""
    seqs, keys, texts = [], [], []
    for f in sentinel["files"]:
        t = packed.read_member(f["file"], columns=["pack_id", "input_ids"])
        col = t.column("input_ids").combine_chunks()
        flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.uint32, copy=False)
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        seqs += np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
        keys += [f"row-{p}" for p in t.column("pack_id").to_pylist()]
        texts.append(megatron_export.decoded_texts(flat, lengths, tok, info["sha256"]))
    docs_out.write(pa.table({"doc_key": pa.array(keys, pa.string()),
                             "text": pa.concat_arrays(texts) if texts else pa.array([], pa.large_string())}))
    written = megatron.write_indexed_dataset(prefix, iter(seqs), info["vocab_size"])
    written["parts"] = 1
    return written


def compute(ctx) -> Result:
    tok, info, tok_bytes = snapshot_tokenizer.load_with_bytes(ctx)  # the bytes it hashed, copied below
    level = ctx.settings.megatron_export
    if level not in EXPORT_LEVELS:
        raise StageError(f"settings.megatron_export {level!r} not in {EXPORT_LEVELS}")
    packed = ctx.input("packed")
    sentinel = packed.sentinel()
    pack.check_tokenizer(sentinel, info["sha256"], info["vocab_size"], packed.uri)
    name = prefix_name(ctx.snapshot)
    d = ctx.workdir("megatron-")
    prefix = d / name
    docs_file = d / f"{name}.documents.parquet"
    docs_schema = pa.schema([("doc_key", pa.string()), ("text", pa.large_string())])
    with ParquetStream(docs_file, docs_schema, release_each_write=False) as docs_out:  # one shard's buffers, reused
        if level == "document":
            written = _document_level(ctx, tok, info, d, prefix, docs_out)
        else:
            written = _row_level(tok, info, packed, sentinel, d, prefix, docs_out)
    release_memory()
    tok_file = d / "tokenizer.json"
    tok_file.write_bytes(tok_bytes)
    verify.write_sidecar(prefix, vocab_size=info["vocab_size"], tokenizer_path=tok_file, tokenizer_sha256=info["sha256"],
                         documents_path=docs_file, extra={"export_level": level, "row_length": ctx.settings.row_length,
                                                          "bin_sha256": written["bin_sha256"],
                                                          "idx_sha256": written["idx_sha256"],
                                                          "documents_sha256": sha256_file(docs_file)})
    lines: list[str] = []
    report = verify.verify_megatron(prefix, out=lines.append, tokenizer_sha256=info["sha256"], vocab_size=info["vocab_size"],
                                    tokenizer=tok)
    if not report.ok:
        raise StageError(f"verify gate failed for {name}: {'; '.join(report.failures)}")
    files = {p.name: p for p in d.iterdir() if p.is_file()}
    figures = {**written, "prefix": f"megatron/{name}", "export_level": level, "verify_ok": report.ok,
               "verify_failures": report.failures, "first_tokens": lines[-2:] if lines else [],
               "tokenizer_sha256": info["sha256"], "vocab_size": info["vocab_size"]}
    return Result({"megatron": Files(dict(files), order=(f"{name}.bin", f"{name}.idx", f"{name}.json"))}, figures)


def verify_gate(g):
    """SPEC §7 verify gate on the committed ``.bin/.idx`` (copied locally from an object
    store); document zero is decoded with the snapshot tokenizer the stage parsed when the
    committed ``tokenizer.json`` has its sha256."""
    f = g.figures
    name = f["prefix"].rsplit("/", 1)[-1]
    lines: list[str] = []
    with g.output("megatron").local() as d:
        report = verify.verify_megatron(d / name, out=lines.append, tokenizer_sha256=f["tokenizer_sha256"],
                                        vocab_size=f["vocab_size"], require_checksums=True,
                                        tokenizer=megatron_export.gate_tokenizer(g.ctx, f["tokenizer_sha256"]))
    return report.ok, "; ".join(report.failures) or "verify passed"


STAGE = Stage(
    name="format", asset="megatron_dataset", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="3",
    kinds=("megatron",),
    description="Stage 10: Megatron .bin/.idx (int32 ids) and the verify gate.",
    inputs=(catalog.TOKENIZED, catalog.CHUNK_DROPS, catalog.PACKED, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST),
    outputs=(catalog.MEGATRON,), settings=SETTINGS, gates=(verify_gate,),
    figures=("sequences", "documents", "tokens", "dtype", "backend", "parts", "bin_sha256", "idx_sha256", "prefix", "export_level",
             "verify_ok", "verify_failures", "first_tokens", "tokenizer_sha256", "vocab_size"),
)
