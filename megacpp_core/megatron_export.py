"""The document-level Megatron export (SPEC §7): one ``.bin/.idx`` sequence per document
exactly as it enters the packed rows (after FIM), shared by the format stage and every
curriculum family.

Memory is one document shard: each shard becomes one part, and the parts are merged in
shard order with the raw writer's ``add_index`` (:data:`MERGE_BACKEND`).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from . import kept, megatron, megatron_merge, pack_inputs
from . import tokenizer as tk
from .tables import ParquetStream

#: Backend of the per-shard parts and their merge: the raw writer, byte-identical to
#: megatron-core's ``IndexedDatasetBuilder`` and ``add_index`` (tests/test_megatron.py),
#: because megatron-core's ``add_index`` runs ``gc.collect()`` per part — measured 0.26 s a
#: part in a small process (3.9 s of 7.5 s for the 15 parts of ``default``), more in a
#: Dagster run.
MERGE_BACKEND = "raw"


def document_level(refs: list, drops: pa.Array, source_order: dict[str, int], settings, tok, info: dict, d: Path,
                   prefix: Path, docs_out: ParquetStream) -> dict:
    """Write ``prefix.bin/.idx`` (int32 ids) from the document shards ``refs`` (input
    references of ``tokenized``-like tables: :data:`megacpp_core.pack_inputs.BASE_COLUMNS`
    and ``text``) but the ``doc_key`` values in ``drops``; ``settings`` gives the row
    length and FIM (:func:`megacpp_core.pack_inputs.fim_config`), ``info`` the
    tokenizer's ``sha256`` and ``vocab_size``; ``d`` is local scratch space. Each shard's
    documents, in keep order, after FIM — exactly the sequences that enter the rows —
    become one part, and ``(doc_key, text)`` of each sequence goes to ``docs_out`` (a FIM
    document's text is decoded from its ids). Memory is one shard's ids and texts: the
    enrichment planes and the chunk graph are not read, since FIM draws its spans from the
    ``doc_key`` and the length only (:func:`megacpp_core.fim.decide`). Returns the merged
    files' figures (:func:`megacpp_core.megatron_merge.merge_indexed_datasets`) plus
    ``parts``."""
    columns, _ = pack_inputs.columns_to_read([])  # ids and text: FIM moves ids by doc_key and length alone
    parts = []
    for j, ref in enumerate(refs):
        docs = kept.read_documents([ref], source_order, columns, drops)
        if not docs.num_rows:
            continue
        inputs, _, _, raw = pack_inputs.packed_documents(docs, settings, tok, info["sha256"])
        seqs = [x.ids for x in inputs]
        raw_lengths = pc.list_value_length(raw.column("input_ids")).to_numpy(zero_copy_only=False).tolist()
        texts = [t if len(q) == n else tk.decode(tok, q[1:])  # a FIM document is decoded from its ids
                 for t, q, n in zip(raw.column("text").to_pylist(), seqs, raw_lengths)]
        part = d / f"part-{j:05d}"
        megatron.write_indexed_dataset(part, iter(seqs), info["vocab_size"], backend=MERGE_BACKEND)
        parts.append(part)
        docs_out.write(pa.table({"doc_key": [x.doc_key for x in inputs], "text": pa.array(texts, pa.large_string())}))
    written = megatron_merge.merge_indexed_datasets(parts, prefix, info["vocab_size"], backend=MERGE_BACKEND)
    for part in parts:
        for ext in (".bin", ".idx"):
            (part.parent / f"{part.name}{ext}").unlink()
    written["parts"] = len(parts)
    return written
