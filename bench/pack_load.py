"""Stage 9–10 speed and packing quality on a finished snapshot; prints one JSON object.

Usage: ``python bench/pack_load.py SNAPSHOT_DIR`` (a materialized ``DATA_ROOT/snapshots/S``;
read-only: outputs go to a temporary directory).

Every timing is the best of :data:`REPEATS` runs, the baseline's and ours alike.

- packing: FIM + best-fit-decreasing ``build_rows`` seconds vs the tokenize stage's own
  wall time re-measured here (goal ≤ 5 %), and rows vs ⌈tokens / L⌉ at L = 8192 and 4096
  (FIM off for the bound check: markers add tokens);
- loader: rows/s of ``PackedRowsDataset`` (init + every item) vs a plain pyarrow read of
  the same columns into numpy (goal: overhead ≤ 1.5×);
- megatron: raw writer vs megatron-core ``IndexedDatasetBuilder`` seconds on the same docs.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pyarrow.parquet as pq

from megacpp_core import loader, manifest, megatron, pack, pack_inputs, tokenize
from megacpp_core import tokenizer as tk
from megacpp_core.layout import SnapshotLayout
from timing import best_of  # bench/timing.py (the script's own directory)

#: Timings are the best of this many runs (baseline and ours alike).
REPEATS = 5


def main(snapshot: Path) -> dict:
    warnings.simplefilter("ignore")
    layout = SnapshotLayout(snapshot.parent.parent, snapshot.name)
    m = manifest.load_manifest(snapshot / "manifest.yaml")
    info = json.loads((snapshot / "tokenizer" / "tokenizer_manifest.json").read_text())
    tok = tk.load_tokenizer(snapshot / "tokenizer" / "tokenizer.json")
    first = next(snapshot.glob("revisions/*/shards/*/tokenized.parquet"))
    columns, optional = pack_inputs.columns_to_read(pq.read_schema(first).names)
    raw = layout.documents("tokenized", columns, without_drops=True)  # what stage 9 reads, enrichment included
    inputs = pack_inputs.pack_inputs(raw, optional)
    texts = raw.column("text").to_pylist()
    ids = [x.ids for x in inputs]
    tokenize_s = best_of(lambda: tk.encode_batch(tok, texts), REPEATS)
    out: dict = {"documents": len(inputs), "tokens": int(sum(len(x) for x in ids)), "tokenize_seconds": round(tokenize_s, 3),
                 "optional_columns": optional}
    t = time.perf_counter()
    tokenize.byte_table(tok, info["tokenizer_sha256"])  # built once per tokenizer and process
    byte_table_s = time.perf_counter() - t
    for L in (8192, 4096):
        fit = [x for x in inputs if len(x.ids) <= L]
        t = time.perf_counter()
        rows = pack.build_rows(fit, L, tk.BOS_ID, tk.PAD_ID, optional=optional)
        pack_s = time.perf_counter() - t
        total = sum(len(x.ids) for x in fit)
        lower = -(-total // L)
        out[f"L{L}"] = {"documents": len(fit), "rows": rows.num_rows, "lower_bound": lower,
                        "rows_over_lower_bound": round(rows.num_rows / lower, 4), "pack_seconds": round(pack_s, 3)}
    fimmed, figs = pack_inputs.apply_fim(inputs, texts, m.settings, tok, info["tokenizer_sha256"])
    fim_s = best_of(lambda: pack_inputs.apply_fim(inputs, texts, m.settings, tok, info["tokenizer_sha256"]), REPEATS)
    rows = pack.build_rows(fimmed, m.settings.row_length, tk.BOS_ID, tk.PAD_ID, optional=optional)
    pack_fim_s = best_of(lambda: pack.build_rows(fimmed, m.settings.row_length, tk.BOS_ID, tk.PAD_ID, optional=optional),
                         REPEATS)
    out["fim"] = {k: figs[k] for k in ("fim_psm", "fim_spm", "fim_skipped_too_long", "fim_doc_comment_masked_tokens")}
    out["fim_seconds"] = round(fim_s, 3)
    out["build_rows_seconds"] = round(pack_fim_s, 3)
    out["packing_seconds"] = round(fim_s + pack_fim_s, 3)
    out["byte_table_seconds"] = round(byte_table_s, 3)
    out["packing_over_tokenize"] = round((fim_s + pack_fim_s) / tokenize_s, 4)
    out["packing_goal"] = 0.05
    out["packing_over_tokenize_incl_byte_table"] = round((fim_s + pack_fim_s + byte_table_s) / tokenize_s, 4)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pack.write_shards(rows, tmp / "packed", row_length=m.settings.row_length, vocab_size=info["vocab_size"],
                          tokenizer_sha256=info["tokenizer_sha256"])
        files = sorted((tmp / "packed").glob("train-*.parquet"))
        def plain() -> int:
            n = 0
            for f in files:
                tb = pq.read_table(f, columns=["input_ids", "target_ids", "loss_mask", "doc_ids", "valid_token_count"])
                for c in ("input_ids", "target_ids", "loss_mask", "doc_ids"):
                    tb.column(c).combine_chunks().flatten().to_numpy().reshape(tb.num_rows, -1)
                n += tb.num_rows
            return n

        def load() -> loader.PackedRowsDataset:
            ds = loader.PackedRowsDataset(tmp / "packed")
            for i in range(len(ds)):
                ds[i]
            return ds

        n, ds = plain(), load()  # warm the page cache for both
        plain_s = best_of(plain, REPEATS)
        loader_s = best_of(load, REPEATS)
        out["loader"] = {"rows": n, "plain_pyarrow_rows_per_s": round(n / plain_s, 1), "loader_rows_per_s": round(len(ds) / loader_s, 1),
                         "overhead": round(loader_s / plain_s, 3)}
        t = time.perf_counter()
        megatron.write_indexed_dataset(tmp / "raw", iter(ids), info["vocab_size"], backend="raw")
        raw_s = time.perf_counter() - t
        megatron._megatron_builder_class()
        t = time.perf_counter()
        megatron.write_indexed_dataset(tmp / "mc", iter(ids), info["vocab_size"], backend="megatron")
        mc_s = time.perf_counter() - t
        same = (tmp / "raw.bin").read_bytes() == (tmp / "mc.bin").read_bytes() and (tmp / "raw.idx").read_bytes() == (tmp / "mc.idx").read_bytes()
        out["megatron"] = {"raw_seconds": round(raw_s, 3), "builder_seconds": round(mc_s, 3),
                           "raw_over_builder": round(raw_s / mc_s, 3), "byte_identical": same}
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else "data/snapshots/default")), indent=2))
