"""Stage 5 — the hybrid tokenizer (SPEC §4 "Tokenizer").

Per snapshot. Inputs: the scrubbed shards and the dedup ``decisions``: the tokenizer trains
on a bounded, deterministic sample of the kept files (``settings.tokenizer_sample_bytes``,
:func:`megacpp_core.kept.sample`; every kept file when they fit). Outputs: ``tokenizer``
(``tokenizer.json``), ``tokenizer_manifest`` (sha256, vocabulary size, band layout) and
``tokenizer_sample_ids``: the ids the round-trip gate encoded, which the chunk and
``p3_repo`` stages take instead of encoding those files again (:mod:`megacpp_core.sample_ids`).
Trains the hybrid byte-level BPE (:mod:`megacpp_core.tokenizer`), or takes the manifest's
pinned ``tokenizer: {path, sha256}`` (sha256 checked, no training). Fails closed when any
document does not round-trip exactly.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import tokenizers

from .. import catalog, sample_ids
from .. import kept as kept_files
from .. import tokenizer as tk
from ..stage import Partitioning, Result, Stage, StageError
from ..tables import write_parquet


def compute(ctx) -> Result:
    kept = kept_files.sample(ctx.inputs("scrubbed"), ctx.input("decisions"), ctx.settings.tokenizer_sample_bytes,
                             workdir=ctx.workdir("tokenizer-sample-"))
    texts = kept_files.TextColumn(kept.column("text"))  # streamed: no Python copy of the sample
    if not len(texts):
        raise StageError(f"snapshot {ctx.snapshot!r}: no file is left after quality, license, scrub and dedup "
                         "(the kept set is empty), so there is nothing to train a tokenizer on or to pack; "
                         "see the exclusions and license decisions of its revisions")
    vocab_size = ctx.settings.vocab_size
    pin = ctx.settings.tokenizer
    if pin is not None:
        try:
            _, lay = tk.pin_tokenizer(pin["path"], pin["sha256"], vocab_size)
        except (tk.TokenizerMismatchError, FileNotFoundError) as e:
            raise StageError(f"pinned tokenizer refused: {e}") from e
        with open(pin["path"], "rb") as f:
            tok_bytes = f.read()  # bytes as pinned, so the sha256 carries over
        info = {"tokenizer_file": tk.TOKENIZER_FILE, "tokenizer_sha256": pin["sha256"],
                "tokenizers_version": tokenizers.__version__, "pinned": {"path": pin["path"], "sha256": pin["sha256"]},
                "snapshot": ctx.snapshot, "special_tokens": tk.SPECIAL_TOKENS, "encode_special_tokens": True,
                "training_documents": 0, **lay}
        fixed_count, learned, reserved, bands = lay["fixed"], lay["learned"], lay["reserved"], lay["bands"]
    else:
        build = tk.train_tokenizer(texts, vocab_size=vocab_size)
        with ctx.scratch("tokenizer-") as d:
            info = tk.save_tokenizer(build, d, extra={"snapshot": ctx.snapshot})
            tok_bytes = (d / tk.TOKENIZER_FILE).read_bytes()
        fixed_count, learned, reserved, bands = build.fixed, build.learned, build.reserved, build.bands
    if pin is None and build.json.encode("utf-8") == tok_bytes:
        tok = build.tokenizer  # parsed from exactly these bytes (train_tokenizer): no second parse
    else:
        tok = tk.tokenizer_from_json(tok_bytes, info["tokenizer_sha256"])
    keys: list[str] = []
    ids: list[np.ndarray] = []

    def keep(batch_keys, batch_ids):
        keys.extend(batch_keys)
        ids.extend(np.asarray(x, np.uint32) for x in batch_ids)

    failures = tk.check_round_trip(tok, zip(kept.column("doc_key").to_pylist(), texts), keep=keep)
    if failures:
        raise StageError(f"tokenizer round trip fails on {len(failures)} documents, first {failures[0]}")
    fixed = tk.SPECIAL_TOKENS + (tk.fixed_tokens() if fixed_count else [])
    figures = {"vocab_size": vocab_size, "fixed": fixed_count, "learned": learned, "reserved": reserved,
               "sha256": info["tokenizer_sha256"], "bands": bands, "training_documents": kept.num_rows,
               "pinned": pin is not None, "seed_morphemes": len(info.get("seed_morphemes") or {}),
               "ids_in_vocab": tok.get_vocab_size(with_added_tokens=True),
               "fixed_at_ids": all(tok.token_to_id(t) == i for i, t in enumerate(fixed)),
               "round_trip_failures": len(failures)}
    shas = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]  # as the scrubbed table's content_sha256
    sample = sample_ids.table(keys, shas, ids, info["tokenizer_sha256"])
    figures.update({"sample_ids_files": sample.num_rows, "sample_ids_tokens": int(sum(len(x) for x in ids))})
    sample_path = write_parquet(sample, ctx.workdir("sample-ids-") / "sample_ids.parquet", sample_ids.ROW_GROUP_ROWS)
    del sample, ids
    manifest_text = json.dumps(info, sort_keys=True, indent=2) + "\n"
    return Result({"tokenizer": tok_bytes, "tokenizer_manifest": json.loads(manifest_text), "tokenizer_sample_ids": sample_path},
                  figures)


def vocab_size_exact(g):
    """The tokenizer has exactly ``vocab_size`` ids (unused ones reserved)."""
    f = g.figures
    return f["ids_in_vocab"] == f["vocab_size"], f"{f['ids_in_vocab']} ids, reserved fill {f['reserved']}"


def fixed_special_ids(g):
    """Special tokens at ids 0-63 and every fixed-band token at its id."""
    f = g.figures
    return bool(f["fixed_at_ids"]), f"special tokens at ids 0-63, {f['fixed']} fixed-band tokens at their ids"


def round_trip_every_document(g):
    """``decode(encode(text)) == text`` for every training document."""
    f = g.figures
    n = f["training_documents"]
    return f["round_trip_failures"] == 0, f"{n - f['round_trip_failures']}/{n} documents round-trip exactly"


STAGE = Stage(
    name="tokenizer", asset="tokenizer", partitioning=Partitioning.SNAPSHOT, compute=compute, code_version="1",
    kinds=("json",),
    description="Stage 5: byte-level BPE trained on the deduplicated snapshot; special tokens at IDs 0-63.",
    inputs=(catalog.SCRUBBED, catalog.DECISIONS), outputs=(catalog.TOKENIZER, catalog.TOKENIZER_MANIFEST, catalog.TOKENIZER_SAMPLE_IDS),
    settings=("vocab_size", "tokenizer", "tokenizer_sample_bytes"),
    gates=(vocab_size_exact, fixed_special_ids, round_trip_every_document),
    figures=("vocab_size", "fixed", "learned", "reserved", "sha256", "bands", "training_documents", "pinned",
             "seed_morphemes", "ids_in_vocab", "fixed_at_ids", "round_trip_failures", "sample_ids_files",
             "sample_ids_tokens"),
)
