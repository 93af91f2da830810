"""Stage 9 — FIM and best-fit-decreasing packing into fixed-length rows (SPEC §6).

Per snapshot. Inputs: every shard's ``tokenized`` documents but the ``chunk_drops``, in
snapshot keep order (:func:`megacpp_core.pack_inputs.read_tokenized`), and the snapshot
``tokenizer``. Output:
``packed`` — parquet shards (``train-*``, ``validation-*``, 1,024-row row groups) and the
``_SUCCESS`` sentinel, committed last. Refuses documents tokenized with another tokenizer
(:class:`~megacpp_core.pack.TokenizerMismatchError`); the producer asserts the row
contract before writing (:class:`~megacpp_core.pack.RowContractError`) and the gate
re-reads every shard from the data root.
"""

from __future__ import annotations

import time

from megacpp_checks.packed import verify_packed_dir

from .. import catalog, pack, pack_inputs, snapshot_tokenizer
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Shards, Stage

SETTINGS = ("row_length", "validation_fraction", "max_docs_per_shard", "fim_rate", "fim_spm_share", "fim_seed",
            "fim_doc_comment_policy")


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    s = ctx.settings
    docs = pack_inputs.read_tokenized(ctx, info["sha256"])
    inputs, optional, fim_figs, _ = pack_inputs.packed_documents(docs, s, tok, info["sha256"])
    t_pack = time.perf_counter()
    rows = pack.build_rows(inputs, s.row_length, tk.BOS_ID, tk.PAD_ID, optional=optional)
    pack_seconds = time.perf_counter() - t_pack
    summary = pack.check_rows(rows, s.row_length, info["vocab_size"], tk.BOS_ID, tk.PAD_ID, where="packed rows")
    lower = -(-summary["tokens"] // s.row_length)
    files, n_val = pack.plan_shards(rows, validation_fraction=s.validation_fraction, max_docs_per_shard=s.max_docs_per_shard)
    sentinel = pack.sentinel_fields(rows, files, n_val, row_length=s.row_length, vocab_size=info["vocab_size"],
                                    tokenizer_sha256=info["sha256"],
                                    extra={"snapshot": ctx.snapshot, "rows_lower_bound": lower, "fim": dict(fim_figs)})
    figures = {**summary, "row_length": s.row_length, "rows_lower_bound": lower,
               "rows_over_lower_bound": round(summary["rows"] / max(1, lower), 4),
               "validation_rows": n_val, "files": len(files),
               "optional_columns": optional, "packing_seconds": round(pack_seconds, 4),
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
             "tokenizer_sha256", "vocab_size", "fim_rate", "fim_spm_share", "fim_seed", "fim_psm", "fim_spm",
             "fim_skipped_too_long", "fim_doc_comment_policy", "fim_doc_comment_masked_tokens",
             "fim_doc_comment_docs"),
)
