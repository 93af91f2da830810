"""Benchmark the hybrid tokenizer against a pure byte-level BPE of the same vocabulary.

Reads the deduplicated default corpus of a finished run (``DATA_ROOT/snapshots/default/
dedup/kept.parquet``), holds out whole sources, trains both tokenizers on the rest and
prints JSON: bytes per token on the held-out files (goal: hybrid >= pure + 3% and >= 3.9),
token counts for common C++ snippets, training times, the round trip of every document,
and the tokenize stage's throughput against raw ``Tokenizer.encode_batch`` on the same
documents (goal >= 0.9x). Both sides of every ratio are timed in this run.

Usage: ``python bench/tokenizer.py [--data-root DIR] [--held-out SRC,SRC] [--vocab 131072]``
"""

from __future__ import annotations

import argparse
import json
import time

import pyarrow as pa

from megacpp_core import tokenize
from megacpp_core import tokenizer as T
from megacpp_core.tables import read_parquet
from timing import best_of  # bench/timing.py (the script's own directory)

SNIPPETS = ["std::vector<std::string>", "0xDEADBEEF", "__global__ void", "std::unique_ptr<Node> node;",
            "#include <cstdint>", "    return nullptr;", "for (size_t i = 0; i < n; ++i) {", "[[nodiscard]] constexpr",
            "EXPECT_EQ(a, b);", "cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);", "float x = 1.0f;",
            "initialize_buffer(read_index, write_value);", "end_point do_something print integer"]
DEFAULT_HELD_OUT = "psycopg2-2.9.13,pygit2-1.21.0,greenlet-3.5.6,msgpack-1.2.4"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-root", default="/tmp/defroot")
    ap.add_argument("--held-out", default=DEFAULT_HELD_OUT)
    ap.add_argument("--vocab", type=int, default=T.DEFAULT_VOCAB_SIZE)
    args = ap.parse_args()
    kept = read_parquet(f"{args.data_root}/snapshots/default/dedup/kept.parquet", columns=["doc_key", "source", "text"])
    d = kept.to_pydict()
    held = set(args.held_out.split(","))
    train = [t for s, t in zip(d["source"], d["text"]) if s not in held]
    test = [t for s, t in zip(d["source"], d["text"]) if s in held]
    test_bytes = sum(len(t.encode("utf-8")) for t in test)
    out: dict = {"vocab_size": args.vocab, "held_out_sources": sorted(held), "train_documents": len(train),
                 "held_out_documents": len(test), "held_out_bytes": test_bytes}
    toks = {}
    for name, hybrid in (("hybrid", True), ("pure_bytelevel_bpe", False)):
        t0 = time.perf_counter()
        b = T.train_tokenizer(train, vocab_size=args.vocab, hybrid=hybrid)
        secs = time.perf_counter() - t0
        tok = b.tokenizer
        toks[name] = tok
        n = sum(len(x) for x in T.encode_batch(tok, test))
        out[name] = {"train_seconds": round(secs, 2), "fixed": b.fixed, "learned": b.learned, "reserved": b.reserved,
                     "held_out_tokens": n, "bytes_per_token": round(test_bytes / n, 4),
                     "round_trip_failures_all_documents": len(T.check_round_trip(tok, zip(d["doc_key"], d["text"]))),
                     "snippets": {s: len(T.encode(tok, s)) for s in SNIPPETS}}
    h, p = out["hybrid"]["bytes_per_token"], out["pure_bytelevel_bpe"]["bytes_per_token"]
    out["hybrid_over_pure"] = round(h / p, 4)
    out["goal_hybrid_ge_pure_plus_3pct"] = h >= 1.03 * p
    out["goal_hybrid_ge_3_9"] = h >= 3.9

    tok = toks["hybrid"]
    docs = pa.table({"doc_key": d["doc_key"], "text": d["text"]})
    texts = d["text"]
    raw = best_of(lambda: tok.encode_batch(texts, add_special_tokens=False))
    stage = best_of(lambda: tokenize.tokenize_documents(docs, tok, args.vocab))
    out["tokenize_throughput"] = {"documents": len(texts), "bytes": sum(len(t.encode("utf-8")) for t in texts),
                                  "raw_encode_batch_seconds": round(raw, 3), "tokenize_stage_seconds": round(stage, 3),
                                  "stage_over_raw_speed": round(raw / stage, 4), "goal_ge_0_9": raw / stage >= 0.9}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
