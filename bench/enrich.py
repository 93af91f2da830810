"""Stage 6 speed (chunk + enrich) against raw tree-sitter parsing; prints one JSON object.

Usage: ``python bench/enrich.py SNAPSHOT_DIR [--repeat N]`` (a materialized
``DATA_ROOT/snapshots/S``, read-only). Over the snapshot's kept files
(``dedup/kept.parquet``), in the same process and run:

- ``parse``: the baseline — tree-sitter parses every file (C grammar for ``.c``, C++ for the
  rest), nothing else;
- ``enrich``: parse + :func:`megacpp_core.enrich.enrich_file` + per-document structure +
  platform scan, with the documents of the whole-file split (no tokenizer);
- ``stage``: what stage 6 does — parse, exact-budget chunking with the snapshot's tokenizer,
  enrichment of every document and the platform scan;

each as seconds, MB/s and a ratio to ``parse`` (goal: the whole stage ≤ 1.5× parse time).
``structure_token_share`` is the share of tokens per StructureCategory, read from the
snapshot's tokenized documents (a snapshot built with ``settings.enrichment`` on, the
default). Best of ``--repeat`` runs (default 1).
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_core.layout import SnapshotLayout
from megacpp_core import chunk, enrich, manifest, platforms
from megacpp_core import tokenizer as tk
from timing import best_of  # bench/timing.py (the script's own directory)


def main(snapshot: Path, repeat: int = 1) -> dict:
    warnings.simplefilter("ignore")
    kept = SnapshotLayout(snapshot.parent.parent, snapshot.name).kept_files(["doc_key", "text", "language"]).to_pydict()
    files = [(k, t, lang) for k, t, lang in zip(kept["doc_key"], kept["text"], kept["language"]) if t]
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for _, t, _ in files) / 1e6
    tok = tk.load_tokenizer(snapshot / "tokenizer" / "tokenizer.json")
    budget = manifest.load_manifest(snapshot / "manifest.yaml").settings.row_length - 1
    counter = lambda s: tk.count_tokens(tok, s)  # noqa: E731

    def parse_only():
        for _, text, lang in files:
            chunk.parse_source(text, lang)

    def enrich_only():
        for _, text, lang in files:
            parsed = chunk.parse_source(text, lang)
            fe = enrich.enrich_file(text, lang, parsed)
            enrich.document_enrichment(fe, 0, len(text))
            platforms.scan_platforms(text)

    def whole_stage():  # as the chunk stage (megacpp_core/stages/chunk.py): whole files counted in one batch first
        whole = [len(e.ids) for e in tok.encode_batch([t for _, t, _ in files], add_special_tokens=False)]
        for (key, text, lang), n in zip(files, whole):
            parsed = chunk.parse_source(text, lang)
            count = lambda s, text=text, n=n: n if s is text else counter(s)  # noqa: E731
            chunks, _ = chunk.split_document_with_stats(text, lang, count, budget, key, parsed)
            fe = enrich.enrich_file(text, lang, parsed)
            for c in chunks:
                enrich.document_enrichment(fe, c.start, c.end)
                platforms.scan_platforms(text[c.start:c.end])

    parse_s = best_of(parse_only, repeat)
    enrich_s = best_of(enrich_only, repeat)
    stage_s = best_of(whole_stage, repeat)
    out = {
        "files": len(files), "megabytes": round(mb, 3),
        "parse": {"seconds": round(parse_s, 3), "mb_per_s": round(mb / parse_s, 3)},
        "enrich": {"seconds": round(enrich_s, 3), "mb_per_s": round(mb / enrich_s, 3),
                   "ratio_to_parse": round(enrich_s / parse_s, 3)},
        "stage": {"seconds": round(stage_s, 3), "mb_per_s": round(mb / stage_s, 3),
                  "ratio_to_parse": round(stage_s / parse_s, 3), "goal_ratio": 1.5,
                  "meets_goal": stage_s / parse_s <= 1.5},
    }
    tokenized = sorted(snapshot.glob("revisions/*/shards/*/tokenized.parquet"))
    names = pq.read_schema(tokenized[0]).names if tokenized else []
    counts = np.zeros(len(chunk.StructureCategory), dtype=np.int64)
    if "structure_ids" in names:
        col = pa.concat_tables([pq.read_table(p, columns=["structure_ids"]) for p in tokenized]).column("structure_ids").combine_chunks()
        offs = col.offsets.to_numpy()
        flat = col.values.to_numpy()
        body = np.ones(len(flat), dtype=bool)
        body[offs[:-1][offs[:-1] < len(flat)]] = False  # skip each document's BOS
        counts += np.bincount(flat[body], minlength=len(counts))[:len(counts)]
        out["structure_token_share_source"] = str(snapshot / "revisions/*/shards/*/tokenized.parquet")
    total = max(1, int(counts.sum()))
    out["structure_tokens"] = int(counts.sum())
    out["structure_token_share"] = {c.name: round(int(counts[c]) / total, 4) for c in chunk.StructureCategory}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(main(args.snapshot, args.repeat), indent=2))
