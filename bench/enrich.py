"""Stage 6 speed (chunk + enrich) against raw tree-sitter parsing; prints one JSON object.

Usage: ``python bench/enrich.py SNAPSHOT_DIR [--repeat N]`` (a materialized
``DATA_ROOT/snapshots/S``, read-only). Over the snapshot's kept files
(``dedup/kept.parquet``), in the same process and run:

- ``parse``: the baseline — tree-sitter parses every file's UTF-8 (C grammar for ``c``, C++
  for the rest), nothing else;
- ``enrich``: parse + :func:`megacpp_core.enrich.enrich_file` + per-document structure +
  platform scan, with the documents of the whole-file split (no tokenizer);
- ``encode``: the snapshot tokenizer encodes every file once (``encode_batch_fast``), the
  floor of any exact-budget chunking (the stage needs every file's exact count);
- ``stage``: what stage 6 does per shard, run on all kept files at once —
  :func:`megacpp_core.stages.chunk.chunk_rows` (parse, exact-budget chunking, enrichment
  of every document, platform scan), without reading or writing parquet, every file
  encoded here;
- ``stage_with_sample_ids``: the same, given the ids the tokenizer stage kept for the
  files it trained on (``tokenizer/sample_ids.parquet``, read as the stage reads it, not
  timed; their decode check is timed), as the pipeline runs it: only the files outside
  the sample are encoded;

each as seconds, MB/s and a ratio to ``parse`` (goal, issue #19: the stage ≤ 2× parse time).
``enrich`` and ``stage`` run with the native tree walk (:mod:`megacpp_core.native.tswalk`,
built by ``make install``); ``python_walk`` times both again with the library switched
off — the Python cursor walk and numpy planes, the same output — and gives
``native_speedup`` (Python walk seconds / native seconds) for each.
``stage_split`` lists, for the stage, how many files were over the budget, how many
characters the span counter encoded beyond the one encoding of each file, and its CPU
seconds: the whole process's and the main thread's (the whole-file encoding runs on a
thread of its own; on a machine with a free core it overlaps the main thread, on a busy
one the wall time adds both). ``stage_cpu_ratio_to_parse_cpu`` divides those by the
parse's CPU seconds (mean per run), a ratio less sensitive to other load than wall time.
``structure_token_share`` is the share of tokens per StructureCategory, read from the
snapshot's tokenized documents (a snapshot built with ``settings.enrichment`` on, the
default). Best of ``--repeat`` runs (default 1).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from megacpp_core.layout import SnapshotLayout
from megacpp_core import catalog, chunk, enrich, manifest, platforms, sample_ids
from megacpp_core.runner import InputRef
from megacpp_core.stage import Partition
from megacpp_core.storage import DataRoot
from megacpp_core.native import tswalk
from megacpp_core.stages import chunk as chunk_stage
from megacpp_core import tokenizer as tk
from timing import best_of  # bench/timing.py (the script's own directory)


def main(snapshot: Path, repeat: int = 1) -> dict:
    warnings.simplefilter("ignore")
    columns = ["doc_key", "text", "language", "source", "path", "archive_sha256", "license_class", "content_sha256"]
    kept = SnapshotLayout(snapshot.parent.parent, snapshot.name).kept_files(columns).to_pydict()
    files = [(k, t, lang) for k, t, lang in zip(kept["doc_key"], kept["text"], kept["language"]) if t]
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for _, t, _ in files) / 1e6
    tok = tk.load_tokenizer(snapshot / "tokenizer" / "tokenizer.json")
    budget = manifest.load_manifest(snapshot / "manifest.yaml").settings.row_length - 1
    sha = tk.tokenizer_sha256(snapshot / "tokenizer" / "tokenizer.json")

    def parse_only():
        for _, text, lang in files:
            chunk.parser_for(chunk.grammar_of(lang)).parse(text.encode("utf-8", "surrogatepass"))

    def enrich_only():
        for _, text, lang in files:
            parsed = chunk.parse_source(text, lang)
            fe = enrich.enrich_file(text, lang, parsed)
            enrich.document_enrichment(fe, 0, len(text))
            platforms.scan_platforms(text)

    def encode_only():
        tok.encode_batch_fast([t for _, t, _ in files], add_special_tokens=False)

    ref = InputRef(DataRoot(snapshot.parent.parent), catalog.TOKENIZER_SAMPLE_IDS, Partition(snapshot.name))
    known = sample_ids.read(ref, kept["doc_key"], kept["content_sha256"], sha)
    split: dict = {}

    def whole_stage():  # the chunk stage's own per-file work (megacpp_core/stages/chunk.py)
        c0, t0 = time.process_time(), time.thread_time()
        _, tally = chunk_stage.chunk_rows(kept, tok, sha, budget, True)
        cpu = {"cpu_seconds": time.process_time() - c0, "main_thread_cpu_seconds": time.thread_time() - t0}
        if not split or cpu["main_thread_cpu_seconds"] < split["main_thread_cpu_seconds"]:
            split.update(cpu)
        split.update({k: tally[k] for k in ("split_files", "span_encoded_chars", "fallback_splits", "brace_files")})

    if not tswalk.available():
        raise SystemExit(f"the native tree walk is not built ({tswalk.LIBRARY}): run `make install`")
    c0 = time.process_time()
    parse_s = best_of(parse_only, repeat)
    parse_cpu = (time.process_time() - c0) / max(1, repeat)
    enrich_s = best_of(enrich_only, repeat)
    encode_s = best_of(encode_only, repeat)
    stage_s = best_of(whole_stage, repeat)
    c0 = time.process_time()
    known_s = best_of(lambda: chunk_stage.chunk_rows(kept, tok, sha, budget, True,
                                                     known_ids=sample_ids.verified(tok, kept["text"], known, sha)), repeat)
    known_cpu = (time.process_time() - c0) / max(1, repeat)
    lib = tswalk._lib
    tswalk._lib = None  # the Python walk: available() is False until it is put back
    try:
        py_enrich_s = best_of(enrich_only, repeat)
        py_stage_s = best_of(lambda: chunk_stage.chunk_rows(kept, tok, sha, budget, True), repeat)
    finally:
        tswalk._lib = lib
    out = {
        "files": len(files), "megabytes": round(mb, 3),
        "parse": {"seconds": round(parse_s, 3), "mb_per_s": round(mb / parse_s, 3)},
        "enrich": {"seconds": round(enrich_s, 3), "mb_per_s": round(mb / enrich_s, 3),
                   "ratio_to_parse": round(enrich_s / parse_s, 3)},
        "encode": {"seconds": round(encode_s, 3), "mb_per_s": round(mb / encode_s, 3),
                   "ratio_to_parse": round(encode_s / parse_s, 3)},
        "stage": {"seconds": round(stage_s, 3), "mb_per_s": round(mb / stage_s, 3),
                  "ratio_to_parse": round(stage_s / parse_s, 3), "goal_ratio": 2.0,
                  "meets_goal": stage_s / parse_s <= 2.0},
        "stage_with_sample_ids": {"seconds": round(known_s, 3), "mb_per_s": round(mb / known_s, 3),
                                  "ratio_to_parse": round(known_s / parse_s, 3), "goal_ratio": 2.0,
                                  "meets_goal": known_s / parse_s <= 2.0,
                                  "files_with_sample_ids": sum(x is not None for x in known),
                                  "cpu_ratio_to_parse_cpu": round(known_cpu / parse_cpu, 3)},
        "python_walk": {"enrich_seconds": round(py_enrich_s, 3), "enrich_ratio_to_parse": round(py_enrich_s / parse_s, 3),
                        "enrich_native_speedup": round(py_enrich_s / enrich_s, 3),
                        "stage_seconds": round(py_stage_s, 3), "stage_ratio_to_parse": round(py_stage_s / parse_s, 3),
                        "stage_native_speedup": round(py_stage_s / stage_s, 3)},
        "stage_split": {k: round(v, 3) if isinstance(v, float) else v for k, v in split.items()},
        "stage_cpu_ratio_to_parse_cpu": {"process": round(split["cpu_seconds"] / parse_cpu, 3),
                                         "main_thread": round(split["main_thread_cpu_seconds"] / parse_cpu, 3)},
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
