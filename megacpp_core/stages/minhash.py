"""Stage 4a — MinHash signatures of one revision's scrubbed files (SPEC §4 "Dedup").

Per repo revision × shard, so each can run as its own pod (``heavy="minhash"``). Input:
``scrubbed``. Output: ``minhash`` — uint32[num_perm] per file with the snapshot's
``minhash_num_perm`` and ``shingle_k`` and seed 1 (:mod:`megacpp_core.minhash`).
"""

from __future__ import annotations

import time

from .. import catalog, minhash
from ..signatures import signatures_table
from ..stage import Partitioning, Result, Stage


def compute(ctx) -> Result:
    s = ctx.settings
    docs = ctx.input("scrubbed").read(columns=["doc_key", "text"])
    texts = docs.column("text").to_pylist()
    c0 = time.process_time()
    sig = minhash.signatures(texts, num_perm=s.minhash_num_perm, k=s.shingle_k)
    cpu = time.process_time() - c0
    table = signatures_table(docs.column("doc_key").to_pylist(), sig)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    figures = {"source": ctx.source.name, "files": len(texts), "bytes": nbytes, "num_perm": s.minhash_num_perm,
               "shingle_k": s.shingle_k, "empty_signatures": int(minhash.is_empty(sig).sum()),
               "signature_bytes": int(sig.nbytes), "mb_per_cpu_second": round(nbytes / 1e6 / cpu, 3) if cpu > 0 else 0.0}
    return Result({"minhash": table}, figures)


def one_signature_per_file(g):
    """Exactly one signature of ``minhash_num_perm`` values per scrubbed file."""
    t, f = g.value("minhash"), g.figures
    width = t.schema.field("signature").type.list_size if t.num_rows else f["num_perm"]
    return (t.num_rows == f["files"] and width == f["num_perm"],
            f"{t.num_rows} signatures of {f['num_perm']} uint32 for {f['files']} files")


STAGE = Stage(
    name="minhash", asset="minhash_signatures", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="1",
    description="Stage 4a: MinHash signatures (uint32[128] per file, 5-token shingles) of one revision.",
    inputs=(catalog.SCRUBBED,), outputs=(catalog.MINHASH,), settings=("minhash_num_perm", "shingle_k"),
    gates=(one_signature_per_file,), heavy="minhash",
    figures=("source", "files", "bytes", "num_perm", "shingle_k", "empty_signatures", "signature_bytes", "mb_per_cpu_second"),
)
