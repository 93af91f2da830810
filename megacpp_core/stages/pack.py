"""Stage 9 — FIM and best-fit-decreasing packing into fixed-length rows (SPEC §6).

Per snapshot, streaming (:mod:`megacpp_core.pack_stream`): the plan reads the document
lengths of every ``tokenized`` shard (less the ``chunk_drops``, in snapshot keep order);
the rows are then built one packing group (``pack_group_tokens``) at a time, each group
reading only its documents, and written to local files in 1,024-row row groups before
the commit. Inputs also the snapshot ``tokenizer``. Output:
``packed`` — parquet shards (``train-*``, ``validation-*``, 1,024-row row groups) and the
``_SUCCESS`` sentinel, committed last. Refuses documents tokenized with another tokenizer
(:class:`~megacpp_core.pack.TokenizerMismatchError`); the producer asserts the row
contract before writing (:class:`~megacpp_core.pack.RowContractError`) and the gate
re-reads every shard from the data root.
"""

from __future__ import annotations

import time

from megacpp_checks.packed import verify_packed_dir

from .. import catalog, pack, pack_inputs, pack_stream, snapshot_tokenizer
from ..stage import Partitioning, Result, Shards, Stage

SETTINGS = ("row_length", "validation_fraction", "max_docs_per_shard", "pack_group_tokens", "fim_rate", "fim_spm_share", "fim_seed",
            "fim_doc_comment_policy")


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    s = ctx.settings
    refs = pack_inputs.tokenized_shards(ctx, info["sha256"])
    order = {src.name: i for i, src in enumerate(ctx.sources)}
    t_pack = time.perf_counter()
    p = pack_stream.plan(refs, order, pack_inputs.chunk_drops(ctx), s, group_tokens=s.pack_group_tokens)
    ctx.log(f"pack: {p.docs.num_rows} documents in {len(p.groups)} packing group(s) → {p.rows} rows, {len(p.files)} files")
    files, summary, fim_figs, optional = pack_stream.write_rows(p, refs, order, s, tok, info["sha256"], info["vocab_size"],
                                                                ctx.workdir("packed-"))
    pack_seconds = time.perf_counter() - t_pack
    lower = -(-summary["tokens"] // s.row_length)
    sentinel = pack.sentinel_fields(p.rows, files, p.validation_rows, row_length=s.row_length, vocab_size=info["vocab_size"],
                                    tokenizer_sha256=info["sha256"], optional=optional,
                                    extra={"snapshot": ctx.snapshot, "rows_lower_bound": lower, "fim": dict(fim_figs)})
    figures = {**summary, "row_length": s.row_length, "rows_lower_bound": lower,
               "rows_over_lower_bound": round(summary["rows"] / max(1, lower), 4),
               "validation_rows": p.validation_rows, "files": len(files),
               "optional_columns": optional, "packing_seconds": round(pack_seconds, 4),
               "packing_groups": len(p.groups), "pack_group_tokens": s.pack_group_tokens,
               "tokenizer_sha256": info["sha256"], "vocab_size": info["vocab_size"], **fim_figs}
    return Result({"packed": Shards(files, sentinel)}, figures)


def row_contract(g):
    """Every shard, re-read from the data root, matches ``_SUCCESS`` (sha256, counts) and
    every row passes the row contract (SPEC §6) and the pandera schema."""
    f = g.figures
    gate = verify_packed_dir(g.output("packed").uri, out=lambda m: None,
                             tokenizer_sha256=f["tokenizer_sha256"], vocab_size=f["vocab_size"])
    return gate.ok, "; ".join(gate.failures) or f"{gate.figures['rows']} rows re-read and valid (SPEC §6, pandera)"


STAGE = Stage(
    name="pack", asset="packed_rows", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="2",
    description="Stage 9: FIM and best-fit-decreasing packing into parquet shards with the _SUCCESS sentinel.",
    inputs=(catalog.TOKENIZED, catalog.CHUNK_DROPS, catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST), outputs=(catalog.PACKED,),
    settings=SETTINGS, gates=(row_contract,),
    figures=("rows", "tokens", "docs", "loss_tokens", "padding_fraction", "row_length", "rows_lower_bound",
             "rows_over_lower_bound", "validation_rows", "files", "optional_columns", "packing_seconds",
             "packing_groups", "pack_group_tokens",
             "tokenizer_sha256", "vocab_size", "fim_rate", "fim_spm_share", "fim_seed", "fim_psm", "fim_spm",
             "fim_skipped_too_long", "fim_doc_comment_policy", "fim_doc_comment_masked_tokens",
             "fim_doc_comment_docs"),
)
