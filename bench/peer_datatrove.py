"""Side-by-side benchmark against datatrove 0.10.1 on the same texts, in the same run;
prints one JSON object.

Usage (``make bench-peer`` builds ``bench/.venv-peer`` with datatrove and runs this)::

    make bench-peer CORPUS=default PEER_ARGS="--repeat 3"
    # or, with bench/.venv-peer built (`make bench/.venv-peer/.installed-stamp`):
    .venv/bin/python bench/peer_datatrove.py --corpus default --data-root DATA_ROOT \\
        [--repeat 3] [--peer-python bench/.venv-peer/bin/python] [--materialize]

Input: a data root where ``megacpp run --corpus CORPUS`` has finished (read-only: every
run of our stages works on a hard-linked copy of the snapshot in a temporary directory,
where they rewrite their own outputs; ``--materialize`` runs ``megacpp run`` first when
the snapshot is missing). :func:`input_texts` selects, from the snapshot's shards:

* ``scrubbed`` — every scrubbed file (``revisions/*/shards/*/scrubbed.parquet``), what our
  minhash stage reads: the dedup comparison's input;
* ``kept`` — the scrubbed files the dedup decisions keep, in keep order, what our chunk
  stage reads: the end-to-end comparison's input;
* ``chunks`` — every shard's chunk documents, what our tokenize stage reads: the tokenize
  comparison's input.

datatrove gets the same texts as one parquet file per input (columns ``id``, ``text``,
written before any timing) and reads it with its ``ParquetReader``. datatrove is not a
dependency of the project: its side runs under ``--peer-python`` (``bench/.venv-peer``,
pinned in ``bench/peer-requirements.txt``), ours under this interpreter. Every run of
either side is a fresh subprocess, run one at a time; both sides run single-process
(datatrove's ``LocalPipelineExecutor`` with ``workers=1``, ours every step in sequence in
one process), and the tokenizers library may use both cores on either side.

Comparisons (each side timed inside its child from its first step to its last; each child
first imports what its steps would import on first use — ours :data:`OUR_PRELOAD`, what
``megacpp run``'s workers have imported before their first step, datatrove's
:data:`PEER_PRELOAD` — and reports as ``timed_imports`` the packages it still imported
while timed; ``process_seconds`` is the child's whole wall time, interpreter start and
imports included; ``peak_rss_mib`` is the child's ``VmHWM`` from ``/proc/self/status``, the
largest reading over its steps since our runner resets it per step; datatrove's
``multiprocess`` manager, a separate process that holds no data, is not counted):

1. ``dedup`` — datatrove's four MinHash stages (``MinhashDedupSignature`` →
   ``MinhashDedupBuckets`` (14 tasks, one per bucket) → ``MinhashDedupCluster`` →
   ``MinhashDedupFilter`` + ``ParquetWriter`` of the kept documents) with 5-grams and
   14 buckets × 8 hashes = 112 hashes, seed 1, 32-bit hashes (``--peer-hash-precision``),
   and a word tokenizer that splits exactly as ours (runs of ``[A-Za-z0-9_]``) with every
   text normalization off, so both sides shingle the same tokens (datatrove's English
   default, NLTK's ``word_tokenize``, needs the punkt data that ``nltk.download`` fetches
   at run time, not a package). Ours: the
   ``minhash`` stage on every shard, the two ``lsh_bands`` steps (cross-source 14 × 8 over
   112 permutations) and the ``dedup`` stage (exact, near within a source at 20 × 6 over
   128 permutations, cross-source; candidates verified on the estimate and the exact
   Jaccard ≥ 0.7), each through :func:`megacpp_core.runner.run_stage` with its gates and
   commit. Settings from :class:`megacpp_core.manifest.Settings` (``shingle_k``,
   ``minhash_num_perm``, ``minhash_threshold``) and :mod:`megacpp_core.dedup`
   (``CROSS_BANDS``, ``CROSS_ROWS``). Reported: seconds, peak RSS, pairs (datatrove: the
   bucket collisions it writes and the distinct document pairs among them; ours: LSH
   candidate pairs of each pass), clusters, documents removed, and how far the two agree
   on which documents are in a duplicate cluster (``in_duplicate_clusters``) and which
   are removed (``removed``; the sides keep different members of a cluster: datatrove
   the union-find root, ours the first in keep order).
2. ``tokenize`` — datatrove's ``DocumentTokenizer`` (our snapshot ``tokenizer.json``, one
   ``<EOS>`` per document as our one ``<BOS>``, its default document shuffle, uint32
   tokens) writing its ``.ds`` files, against our ``tokenize`` (every shard), ``pack``
   and ``format`` stages writing the packed rows and the Megatron ``.bin/.idx``.
3. ``end_to_end`` — scrubbed (kept) texts to training-ready tokens: datatrove's tokenizer
   as in 2 on the kept files, against our ``chunk`` (chunk + enrich, every shard),
   ``chunk_dedup``, ``tokenize``, ``pack`` and ``format`` stages.

Ratios (all > 1 in our favour):

* ``speed_ratio`` = datatrove seconds / our seconds on the same input: ≥ 1× means we are
  at least as fast;
* ``tokens_per_s_ratio`` = our tokens/s / datatrove tokens/s (each side's own token count:
  ours the Megatron export's tokens, BOS and FIM sentinels included; datatrove's the
  tokens of its ``.ds`` files, EOS included): ≥ 1× means we are at least as fast;
* ``peak_rss_ratio`` = datatrove peak RSS / our peak RSS: ≥ 1× means we use no more memory;
* ``full_cores.speed_ratio_ceiling`` = datatrove seconds / (our CPU seconds / usable
  cores): the speed ratio our side would reach if its CPU work kept every core busy from
  its first step to its last. Each side reports ``cpu_seconds`` (user + system time of
  every thread of its child over the timed steps, :func:`cpu_seconds`; the ceiling takes
  our least over the runs, ``cpu_seconds_min``). A ceiling below 1 means better overlap
  of the same work cannot reach a speed ratio of 1 on these cores; only less CPU work on
  our side can;
* ``with_dedup.speed_ratio`` = (datatrove dedup + datatrove end-to-end seconds) / (our
  dedup + our end-to-end seconds): scrubbed texts to training-ready tokens, dedup included.

Every timing is the best of ``--repeat`` runs of that side (fresh process each); peak RSS
is the largest over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent

#: datatrove release benchmarked (``bench/peer-requirements.txt`` pins it and its dependencies).
PEER_VERSION = "0.10.1"
#: Python of the separate virtualenv holding datatrove (``make bench-peer`` creates it).
PEER_PYTHON = HERE / ".venv-peer" / "bin" / "python"
#: The token datatrove appends to every document (our tokenize stage starts each one with
#: ``<BOS>``; both are one special token of the snapshot tokenizer per document).
PEER_EOS = "<EOS>"
#: Word split of our shingles (:data:`megacpp_core.dedup._TOKEN`, :mod:`megacpp_core.minhash`),
#: given to datatrove as its word tokenizer.
TOKEN_PATTERN = r"[A-Za-z0-9_]+"
#: Our stages per comparison, in the graph's order (names of :data:`megacpp_core.stages.STAGES`;
#: ``lsh_bands`` stands for every band-range step).
OUR_STEPS = {
    "dedup": ("minhash", "lsh_bands", "dedup"),
    "tokenize": ("tokenize", "pack", "format"),
    "end_to_end": ("chunk", "chunk_dedup", "tokenize", "pack", "format"),
}
#: Files of a finished snapshot the comparisons read (relative to the snapshot directory).
REQUIRED = ("manifest.yaml", "dedup/decisions.parquet", "tokenizer/tokenizer.json", "documents/chunk_drops.parquet")


#: Modules our compared stages import on their first use that ``megacpp run``'s fork server
#: imports once for every worker before its first step (:data:`megacpp_assets.run_workers.PRELOAD`:
#: the schema checks' pandera with the pandas backend its first validation registers,
#: hypothesis included), imported by our child before its timing starts, as a worker has
#: them. What a worker imports itself (polars, at the dedup gate) stays timed and is
#: listed in ``timed_imports``.
OUR_PRELOAD = ("pandera", "pandera.backends.pandas.register", "pandera.backends.pandas.builtin_checks")
#: Modules datatrove's steps import on their first use (its executor's ``multiprocess``
#: pool and manager, numpy's random generators, the xxhash MinHash hasher), imported by
#: its child before its timing starts.
PEER_PRELOAD = ("runpy", "mmap", "multiprocess.pool", "multiprocess.managers", "multiprocess.shared_memory",
                "multiprocessing.synchronize", "numpy.random", "xxhash", "datatrove.utils.hashes.xxhash")


def preload(modules: tuple[str, ...]) -> None:
    """Import ``modules`` (each child calls it before its timing: imports are not timed)."""
    import importlib

    for m in modules:
        importlib.import_module(m)


def cpu_seconds() -> float:
    """CPU seconds (user + system) this process and its waited-for children have used
    (``os.times``): every thread counts, so a side that keeps two cores busy for one
    second of wall time uses two CPU seconds."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed_imports(before: set[str]) -> list[str]:
    """Top-level packages of the modules imported since ``before`` (a copy of
    ``sys.modules``' keys taken when the timing started), sorted: what a child imported
    while it was timed (each child reports it; an empty list means no import was timed)."""
    return sorted({m.split(".")[0] for m in set(sys.modules) - before})


# ---------------------------------------------------------------- inputs (our venv)

def snapshot_dir(data_root: str | os.PathLike, snapshot: str) -> Path:
    """``DATA_ROOT/snapshots/SNAPSHOT`` (:class:`megacpp_core.layout.SnapshotLayout`)."""
    from megacpp_core.layout import SnapshotLayout

    return SnapshotLayout(Path(data_root), snapshot).root


def missing_outputs(data_root: str | os.PathLike, snapshot: str) -> list[str]:
    """The files of :data:`REQUIRED` (and the shards' ``scrubbed``/``chunks``) a finished
    ``megacpp run`` would have left and ``data_root`` lacks; empty when the snapshot is
    ready for this benchmark."""
    snap = snapshot_dir(data_root, snapshot)
    out = [r for r in REQUIRED if not (snap / r).exists()]
    for name in ("scrubbed", "chunks"):
        if not any(snap.glob(f"revisions/*/shards/*/{name}.parquet")):
            out.append(f"revisions/*/shards/*/{name}.parquet")
    return out


def input_texts(data_root: str | os.PathLike, snapshot: str) -> dict:
    """The texts both sides read, as ``{name: pyarrow.Table}`` with string columns
    ``doc_key`` and ``text`` (one row per document):

    * ``"scrubbed"`` — every row of every ``revisions/*/shards/*/scrubbed.parquet`` (our
      minhash stage's input), in path order;
    * ``"kept"`` — the scrubbed files ``dedup/decisions.parquet`` keeps, in keep order
      (:meth:`~megacpp_core.layout.SnapshotLayout.kept_files`, our chunk stage's input);
    * ``"chunks"`` — every shard's chunk documents in snapshot keep order, chunk-level
      dedup drops included (:meth:`~megacpp_core.layout.SnapshotLayout.documents`, our
      tokenize stage's input).

    Raises ``FileNotFoundError`` naming what is missing when the snapshot has not been
    materialized up to its chunks (:func:`missing_outputs`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from megacpp_core.layout import SnapshotLayout

    missing = missing_outputs(data_root, snapshot)
    if missing:
        raise FileNotFoundError(f"{snapshot_dir(data_root, snapshot)}: missing {', '.join(missing)} "
                                f"(run `megacpp run --corpus {snapshot} --data-root {data_root}` first)")
    layout = SnapshotLayout(Path(data_root), snapshot)
    cols = ["doc_key", "text"]
    scrubbed = [pq.read_table(p, columns=cols) for p in sorted(layout.root.glob("revisions/*/shards/*/scrubbed.parquet"))]
    return {
        "scrubbed": pa.concat_tables(scrubbed).combine_chunks(),
        "kept": layout.kept_files(cols).select(cols).combine_chunks(),
        "chunks": layout.documents("chunks", cols).select(cols).combine_chunks(),
    }


def text_stats(table) -> dict:
    """``{"documents": rows, "mb": UTF-8 MB (10**6 bytes) of the text column}`` of a table
    of :func:`input_texts`."""
    import pyarrow.compute as pc

    nbytes = pc.sum(pc.binary_length(table.column("text"))).as_py() or 0
    return {"documents": table.num_rows, "mb": round(nbytes / 1e6, 3)}


def export_for_peer(table, folder: Path) -> Path:
    """Write ``table`` (:func:`input_texts`) as ``folder/part-00000.parquet`` with columns
    ``id`` (our ``doc_key``) and ``text``, the names datatrove's ``ParquetReader`` reads by
    default; returns ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": table.column("doc_key"), "text": table.column("text")}), folder / "part-00000.parquet")
    return folder


def our_steps(comparison: str, root, manifest) -> list:
    """``[(Stage, Partition)]`` our side runs for ``comparison`` (a key of :data:`OUR_STEPS`),
    in the order ``megacpp run`` runs them: shard by shard of every revision of
    ``manifest`` (shard plans read from ``root``, a :class:`~megacpp_core.storage.DataRoot`),
    each shard's stages one after another as its step runs them (chunk then tokenize, so
    tokenize takes the whole files' ids chunk encoded: :mod:`megacpp_core.ids_memo`); then
    per-revision stages; then snapshot stages once, in the graph's order. Raises
    ``KeyError`` for an unknown comparison."""
    from megacpp_core.runner import revision_shards
    from megacpp_core.stage import Partition, Partitioning
    from megacpp_core.stages import STAGES

    wanted = OUR_STEPS[comparison]
    chosen = [st for st in STAGES
              if st.name in wanted or ("lsh_bands" in wanted and st.name.startswith("lsh_bands_"))]
    steps = []
    shard_stages = [st for st in chosen if st.partitioning is Partitioning.REVISION_SHARD]
    for src in manifest.sources:
        for k in revision_shards(root, manifest.name, src.name) if shard_stages else ():
            steps.extend((st, Partition(manifest.name, src.name, k)) for st in shard_stages)
    for st in chosen:
        if st.partitioning is Partitioning.REVISION:
            steps.extend((st, Partition(manifest.name, src.name)) for src in manifest.sources)
    steps.extend((st, Partition(manifest.name)) for st in chosen if st.partitioning is Partitioning.SNAPSHOT)
    return steps


# ---------------------------------------------------------------- children

def ours_child(comparison: str, root_dir: str, snapshot: str, out_file: str) -> None:
    """Run our steps of ``comparison`` on the (linked) data root ``root_dir`` in this fresh
    process and write ``{"seconds", "stage_seconds", "peak_rss_mib", "figures", ...}`` as
    JSON to ``out_file``. Raises ``SystemExit`` when a step's gates fail."""
    import pyarrow.parquet as pq

    from megacpp_core.manifest import load_manifest
    from megacpp_core.runner import run_stage
    from megacpp_core.storage import open_root
    from scale import vm_hwm_mb  # bench/scale.py (the script's own directory)

    snap = Path(root_dir) / "snapshots" / snapshot
    manifest = load_manifest(str(snap / "manifest.yaml"))
    root = open_root(root_dir)
    steps = our_steps(comparison, root, manifest)
    preload(OUR_PRELOAD)
    peak = vm_hwm_mb()
    stage_seconds: dict[str, float] = {}
    figures: dict[str, dict] = {}
    modules = set(sys.modules)
    c0, t0 = cpu_seconds(), time.perf_counter()
    for st, part in steps:
        t = time.perf_counter()
        res = run_stage(st, root, manifest, part)
        stage_seconds[st.name] = stage_seconds.get(st.name, 0.0) + time.perf_counter() - t
        peak = max(peak, vm_hwm_mb())  # run_stage resets VmHWM before each compute
        if not res.ok:
            raise SystemExit(f"{st.name} {part.key}: gates failed {[k for k, v in res.checks.items() if not v[0]]}")
        if part.source is None:
            figures[st.name] = res.figures
        else:
            agg = figures.setdefault(st.name, {})
            for k in ("files", "documents", "tokens"):
                if isinstance(res.figures.get(k), int):
                    agg[k] = agg.get(k, 0) + res.figures[k]
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    out = {"seconds": seconds, "cpu_seconds": cpu, "stage_seconds": stage_seconds, "steps": len(steps),
           "peak_rss_mib": peak, "timed_imports": timed_imports(modules)}
    if comparison == "dedup":
        f = figures["dedup"]
        keep = pq.read_table(snap / "dedup" / "decisions.parquet", columns=["doc_key", "keep"]).to_pydict()
        out["figures"] = {k: f.get(k) for k in ("files_in", "exact_removed", "near_removed", "cross_source_removed",
                                                "files_out", "clusters", "near_candidate_pairs", "near_rejected_by_exact",
                                                "cross_candidate_pairs", "cross_confirmed_pairs", "cross_source_clusters")}
        out["figures"]["lsh_band_candidate_pairs"] = sum(figures[s]["candidate_pairs"] for s in figures
                                                         if s.startswith("lsh_bands_"))
        out["removed"] = sorted(k for k, kept in zip(keep["doc_key"], keep["keep"]) if not kept)
        members = pq.read_table(snap / "dedup" / "duplicate_clusters.parquet", columns=["doc_key"]).column("doc_key")
        out["in_clusters"] = sorted(set(members.to_pylist()))
        out["figures"]["documents_in_clusters"] = len(out["in_clusters"])
    else:
        fmt, pk = figures["format"], figures["pack"]
        out["figures"] = {"tokens": fmt["tokens"], "documents": fmt["documents"], "packed_rows": pk["rows"],
                          "tokenize_tokens": figures["tokenize"]["tokens"], "megatron_dtype": fmt.get("dtype"),
                          "megatron_bin_bytes": (snap / f"{fmt['prefix']}.bin").stat().st_size}
        if "chunk" in figures:
            out["figures"]["chunk_documents"] = figures["chunk"].get("documents")
    Path(out_file).write_text(json.dumps(out))


def peer_child(comparison: str, input_dir: str, work_dir: str, out_file: str, tokenizer: str = "",
               n_grams: int = 5, buckets: int = 14, hashes_per_bucket: int = 8, precision: int = 32) -> None:
    """Run datatrove's side of ``comparison`` (``"dedup"``, or ``"tokenize"`` for both token
    comparisons) on the parquet files of ``input_dir`` in this fresh process (the peer
    venv's Python: imports only datatrove, its dependencies and the standard library),
    writing its files under ``work_dir``; writes ``{"seconds", "stage_seconds",
    "peak_rss_mib", "figures", ...}`` as JSON to ``out_file``."""
    import pyarrow.parquet as pq
    import regex  # a datatrove dependency

    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.utils.logging import logger
    from scale import vm_hwm_mb  # bench/scale.py (the script's own directory)

    logger.remove()  # loguru to stderr: quiet, as our runner's log is
    preload(PEER_PRELOAD)
    work = Path(work_dir)
    stage_seconds: dict[str, float] = {}

    def run(name: str, pipeline: list, tasks: int = 1) -> None:
        t = time.perf_counter()
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=str(work / "logs" / name)).run()
        stage_seconds[name] = time.perf_counter() - t

    out: dict = {}
    if comparison == "dedup":
        from datatrove.pipeline.dedup import (MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter,
                                              MinhashDedupSignature)
        from datatrove.pipeline.dedup.minhash import MinhashConfig
        from datatrove.pipeline.writers import ParquetWriter
        from datatrove.utils.hashing import HashConfig
        from datatrove.utils.text import TextNormConfig
        from datatrove.utils.word_tokenizers import WordTokenizer

        pattern = regex.compile(TOKEN_PATTERN)

        class CodeTokens(WordTokenizer):
            """Our shingle tokens (maximal runs of ``[A-Za-z0-9_]``) as datatrove words."""

            def word_tokenize(self, text: str) -> list[str]:
                return pattern.findall(text)

            def sent_tokenize(self, text: str) -> list[str]:
                return [text]

            def span_tokenize(self, text: str) -> list[tuple[int, int]]:
                return [(0, len(text))]

        config = MinhashConfig(n_grams=n_grams, num_buckets=buckets, hashes_per_bucket=hashes_per_bucket, seed=1,
                               norm_config=TextNormConfig(lowercase=False, norm_whitespace=False, remove_punctuation=False,
                                                          norm_unicode_diacritics=False, norm_numbers=False),
                               hash_config=HashConfig(precision=precision, hash_fc="xxhash"))
        sigs, dups, remove, kept = (str(work / d) for d in ("signatures", "buckets", "remove_ids", "kept"))
        words = CodeTokens()
        peak = vm_hwm_mb()
        modules = set(sys.modules)
        c0, t0 = cpu_seconds(), time.perf_counter()
        run("1_signature", [ParquetReader(input_dir), MinhashDedupSignature(output_folder=sigs, config=config, language=words)])
        run("2_buckets", [MinhashDedupBuckets(input_folder=sigs, output_folder=dups, config=config)], tasks=buckets)
        run("3_cluster", [MinhashDedupCluster(input_folder=dups, output_folder=remove, config=config)])
        run("4_filter", [ParquetReader(input_dir), MinhashDedupFilter(input_folder=remove), ParquetWriter(kept)])
        seconds, out["cpu_seconds"] = time.perf_counter() - t0, cpu_seconds() - c0
        out["timed_imports"] = timed_imports(modules)
        peak = max(peak, vm_hwm_mb())
        # figures, read back after the timing
        import numpy as np

        # a .dups record: (file, doc, file, doc) as little-endian uint32
        records = [np.fromfile(f, dtype="<u4").reshape(-1, 4) for f in sorted(Path(dups).glob("*.dups"))]
        records = np.concatenate(records).tolist() if records else []
        pairs = {tuple(sorted(((a, b), (c, d)))) for a, b, c, d in records}
        nodes = {n for p in pairs for n in p}
        removed_n = sum(f.stat().st_size // 4 for f in Path(remove).glob("*.remove"))
        ids_in = pq.read_table(input_dir, columns=["id"]).column("id").to_pylist()
        ids_out = set()
        for f in Path(kept).glob("*.parquet"):
            ids_out.update(pq.read_table(f, columns=["id"]).column("id").to_pylist())
        line = hashes_per_bucket * (4 if precision == 32 else 8) + 4
        signed = sum(f.stat().st_size // line for f in Path(sigs).glob("bucket_000/*.minhash.sig"))
        out["figures"] = {"documents_in": len(ids_in), "documents_without_signature": len(ids_in) - signed,
                          "bucket_pair_records": len(records), "unique_pairs": len(pairs),
                          "documents_in_clusters": len(nodes), "clusters": len(nodes) - removed_n,
                          "removed": removed_n, "documents_out": len(ids_out)}
        out["removed"] = sorted(set(ids_in) - ids_out)
        # one task reads the one input file: a pair's document id is its row in that file
        out["in_clusters"] = sorted({ids_in[doc] for _, doc in nodes})
    else:
        from datatrove.pipeline.tokens import DocumentTokenizer

        tokens_dir = work / "tokens"
        peak = vm_hwm_mb()
        modules = set(sys.modules)
        c0, t0 = cpu_seconds(), time.perf_counter()
        run("tokenize", [ParquetReader(input_dir),
                         DocumentTokenizer(output_folder=str(tokens_dir), tokenizer_name_or_path=tokenizer,
                                           eos_token=PEER_EOS, seed=0)])
        seconds, out["cpu_seconds"] = time.perf_counter() - t0, cpu_seconds() - c0
        out["timed_imports"] = timed_imports(modules)
        peak = max(peak, vm_hwm_mb())
        meta = [f.read_text().splitlines() for f in tokens_dir.glob("*.ds.metadata")]
        index = sum(f.stat().st_size // 8 for f in tokens_dir.glob("*.ds.index"))
        out["figures"] = {"tokens": sum(int(m[1]) for m in meta), "documents": index,
                          "token_bytes": int(meta[0][0].rsplit("|", 1)[1]) if meta else None,
                          "ds_bytes": sum(f.stat().st_size for f in tokens_dir.glob("*.ds"))}
    out.update({"seconds": seconds, "stage_seconds": stage_seconds, "peak_rss_mib": peak})
    Path(out_file).write_text(json.dumps(out))


# ---------------------------------------------------------------- parent

def _link_snapshot(data_root: Path, snapshot: str, dest: Path) -> Path:
    """A data root at ``dest`` holding ``snapshots/SNAPSHOT`` of ``data_root`` as hard links
    (``bench/format.py``'s helper; a copy across file systems); returns ``dest``. The
    tokenizer's sample ids (``tokenizer/sample_ids.parquet``) are left out: in the
    pipeline the tokenizer stage's round-trip gate encodes those files once and chunk and
    p3_repo reuse the ids, but that stage is not timed here, so our chunk stage encodes
    every file as datatrove's tokenizer does."""
    from format import _link_tree  # bench/format.py (the script's own directory)

    _link_tree(snapshot_dir(data_root, snapshot), dest / "snapshots" / snapshot)
    (dest / "snapshots" / snapshot / "tokenizer" / "sample_ids.parquet").unlink(missing_ok=True)
    return dest


def _spawn(python: str, args: list[str], out_file: Path, env: dict | None = None) -> dict:
    """Run this script as ``python`` with ``args`` in a fresh process; returns the JSON it
    wrote to ``out_file`` plus ``process_seconds`` (its whole wall time). Raises
    ``SystemExit`` with the tail of its stderr when it fails."""
    t = time.perf_counter()
    r = subprocess.run([python, str(Path(__file__).resolve()), *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} under {python} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    res = json.loads(out_file.read_text())
    res["process_seconds"] = wall
    return res


def _best(runs: list[dict]) -> dict:
    """The fastest of ``runs`` (by ``seconds``) with ``peak_rss_mib`` the largest of all."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    best["cpu_seconds_min"] = min(r["cpu_seconds"] for r in runs)
    best["runs_seconds"] = [round(r["seconds"], 3) for r in runs]
    return best


def _side(res: dict, **extra) -> dict:
    """One side's figures for the JSON, times rounded."""
    out = {"seconds": round(res["seconds"], 3), "process_seconds": round(res["process_seconds"], 3),
           "runs_seconds": res["runs_seconds"], "cpu_seconds": round(res["cpu_seconds"], 3),
           "cpu_seconds_min": round(res["cpu_seconds_min"], 3), "peak_rss_mib": round(res["peak_rss_mib"], 1),
           "stage_seconds": {k: round(v, 3) for k, v in res["stage_seconds"].items()},
           "timed_imports": res.get("timed_imports", [])}
    out.update(res.get("figures", {}))
    out.update(extra)
    return out


def full_cores(peer_seconds: float, our_cpu_seconds: float, cores: float) -> dict:
    """What our side could reach at most on ``cores`` cores doing the CPU work it did:
    ``floor_seconds`` = ``our_cpu_seconds / cores`` (every core busy from the first step to
    the last, no wait anywhere) and ``speed_ratio_ceiling`` = ``peer_seconds`` over that
    floor. A ceiling below 1 means better overlap of the same work cannot reach a speed
    ratio of 1 on ``cores`` cores; only less CPU work on our side can."""
    from timing import full_cores_floor  # bench/timing.py (the script's own directory)

    floor = full_cores_floor(our_cpu_seconds, cores)
    return {"cores": cores, "ours_cpu_seconds": round(our_cpu_seconds, 3), "floor_seconds": round(floor, 3),
            "speed_ratio_ceiling": _ratio(peer_seconds, floor)}


def _ratio(a: float, b: float) -> float | None:
    """``a / b`` to three decimals; None when ``b`` is 0."""
    return round(a / b, 3) if b else None


def _materialize(corpus: str, data_root: Path) -> None:
    """``megacpp run --corpus CORPUS --data-root DATA_ROOT`` in a fresh process."""
    env = {**os.environ, "DAGSTER_HOME": os.environ.get("DAGSTER_HOME", str(data_root / "dagster_home"))}
    Path(env["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    code = subprocess.call([sys.executable, "-m", "megacpp_assets.cli", "run", "--corpus", corpus, "--data-root",
                            str(data_root)], cwd=PROJECT, env=env, stdout=sys.stderr)
    if code != 0:
        raise SystemExit(f"megacpp run --corpus {corpus} failed with exit code {code}")


def _peer_versions(python: str) -> dict:
    """``{package: version}`` of the benchmarked packages in the venv of ``python``, and its
    Python version; raises ``subprocess.CalledProcessError`` when one is missing."""
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in "
            "('datatrove', 'tokenizers', 'xxhash', 'numpy', 'pyarrow')} | {'python': sys.version.split()[0]}))")
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours-child", nargs=4, metavar=("COMPARISON", "ROOT", "SNAPSHOT", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--peer-child", help=argparse.SUPPRESS)  # JSON of peer_child's keyword arguments
    ap.add_argument("--corpus", default="default", help="the snapshot (corpus manifest name) to read")
    ap.add_argument("--data-root", default=os.environ.get("MEGACPP_DATA_ROOT", str(PROJECT / "data")))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side per comparison; the best is reported")
    ap.add_argument("--peer-python", default=str(PEER_PYTHON), help="Python of the virtualenv holding datatrove")
    ap.add_argument("--peer-hash-precision", type=int, choices=(32, 64), default=32,
                    help="datatrove's minhash precision (32: uint32 signatures like ours; 64: datatrove's default)")
    ap.add_argument("--work-dir", default=None, help="where the temporary files go (default: the system temp dir)")
    ap.add_argument("--materialize", action="store_true", help="run `megacpp run` first when the snapshot is missing")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))  # bench/ helpers (scale, format) for the children
    if a.ours_child:
        sys.path.insert(0, str(PROJECT))
        ours_child(*a.ours_child)
        return {}
    if a.peer_child:
        peer_child(**json.loads(a.peer_child))
        return {}
    sys.path.insert(0, str(PROJECT))
    import importlib.metadata as md

    from megacpp_core import dedup
    from megacpp_core.manifest import load_manifest

    data_root = Path(a.data_root).resolve()
    if missing_outputs(data_root, a.corpus):
        if not a.materialize:
            raise SystemExit(f"{snapshot_dir(data_root, a.corpus)} lacks {', '.join(missing_outputs(data_root, a.corpus))}: "
                             f"run `megacpp run --corpus {a.corpus} --data-root {data_root}` or pass --materialize")
        _materialize(a.corpus, data_root)
    if not Path(a.peer_python).exists():
        raise SystemExit(f"{a.peer_python} not found: `make bench-peer` creates the datatrove virtualenv")
    peer_versions = _peer_versions(a.peer_python)
    if peer_versions["datatrove"] != PEER_VERSION:
        raise SystemExit(f"{a.peer_python} has datatrove {peer_versions['datatrove']}, not {PEER_VERSION}: "
                         "rebuild it with `make bench-peer`")
    snap = snapshot_dir(data_root, a.corpus)
    settings = load_manifest(str(snap / "manifest.yaml")).settings
    tokenizer = str(snap / "tokenizer" / "tokenizer.json")
    peer_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the project in the peer venv

    load0 = os.getloadavg()[0]  # other work on the machine shares its cores with both sides
    from timing import usable_cores  # bench/timing.py (the script's own directory)

    cores = usable_cores()
    tmp = Path(tempfile.mkdtemp(prefix="bench-peer-", dir=a.work_dir))
    try:
        texts = input_texts(data_root, a.corpus)
        inputs = {name: text_stats(t) for name, t in texts.items()}
        folders = {name: export_for_peer(t, tmp / "inputs" / name) for name, t in texts.items()}
        del texts
        peer_args = {"n_grams": settings.shingle_k, "buckets": dedup.CROSS_BANDS, "hashes_per_bucket": dedup.CROSS_ROWS,
                     "precision": a.peer_hash_precision, "tokenizer": tokenizer}
        plan = {"dedup": ("dedup", "scrubbed"), "tokenize": ("tokenize", "chunks"), "end_to_end": ("tokenize", "kept")}
        runs: dict[str, dict[str, list]] = {c: {"datatrove": [], "ours": []} for c in plan}
        n = 0
        for _ in range(max(1, a.repeat)):
            for comparison, (peer_kind, source) in plan.items():
                n += 1
                work = tmp / f"run{n:03d}"
                (work / "peer").mkdir(parents=True)
                out = work / "peer.json"
                spec = {**peer_args, "comparison": peer_kind, "input_dir": str(folders[source]),
                        "work_dir": str(work / "peer"), "out_file": str(out)}
                runs[comparison]["datatrove"].append(_spawn(a.peer_python, ["--peer-child", json.dumps(spec)], out, peer_env))
                root = _link_snapshot(data_root, a.corpus, work / "root")
                out = work / "ours.json"
                runs[comparison]["ours"].append(_spawn(sys.executable, ["--ours-child", comparison, str(root), a.corpus,
                                                                        str(out)], out))
                shutil.rmtree(work, ignore_errors=True)
                print(f"{comparison}: datatrove {runs[comparison]['datatrove'][-1]['seconds']:.2f}s, "
                      f"ours {runs[comparison]['ours'][-1]['seconds']:.2f}s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    best = {c: {side: _best(r) for side, r in sides.items()} for c, sides in runs.items()}
    result: dict = {
        "corpus": a.corpus, "data_root": str(data_root), "repeat": max(1, a.repeat),
        "machine": {"cpus": os.cpu_count(), "usable_cores": cores, "python": sys.version.split()[0],
                    "load_average_1m": {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)}},
        "versions": {"datatrove_venv": peer_versions,
                     "ours_venv": {p: md.version(p) for p in ("tokenizers", "numpy", "pyarrow", "datasketch")}},
        "inputs": inputs,
    }
    # 1. dedup
    dt, us = best["dedup"]["datatrove"], best["dedup"]["ours"]
    dt_removed, us_removed = set(dt.pop("removed")), set(us.pop("removed"))
    dt_members, us_members = set(dt.pop("in_clusters")), set(us.pop("in_clusters"))
    result["dedup"] = {
        "input": "scrubbed",
        "settings": {"n_grams": settings.shingle_k, "datatrove_buckets": dedup.CROSS_BANDS,
                     "datatrove_hashes_per_bucket": dedup.CROSS_ROWS,
                     "datatrove_hashes": dedup.CROSS_BANDS * dedup.CROSS_ROWS, "datatrove_hash_precision": a.peer_hash_precision,
                     "datatrove_word_split": TOKEN_PATTERN, "datatrove_text_normalization": "none",
                     "ours_num_perm": settings.minhash_num_perm, "ours_threshold": settings.minhash_threshold,
                     "ours_cross_source_bands_x_rows": f"{dedup.CROSS_BANDS}x{dedup.CROSS_ROWS}",
                     "ours_near_bands_x_rows": "{}x{}".format(*dedup.near_lsh_params(settings.minhash_threshold,
                                                                                     settings.minhash_num_perm)),
                     "ours_verify_exact": settings.minhash_verify_exact},
        "datatrove": _side(dt), "ours": _side(us),
        "in_duplicate_clusters": {"both": len(dt_members & us_members), "only_datatrove": len(dt_members - us_members),
                                  "only_ours": len(us_members - dt_members)},
        "removed": {"both": len(dt_removed & us_removed), "only_datatrove": len(dt_removed - us_removed),
                    "only_ours": len(us_removed - dt_removed)},
        "speed_ratio": _ratio(dt["seconds"], us["seconds"]),
        "full_cores": full_cores(dt["seconds"], us["cpu_seconds_min"], cores),
        "peak_rss_ratio": _ratio(dt["peak_rss_mib"], us["peak_rss_mib"]),
    }
    # 2. tokenize and 3. end to end
    for comparison in ("tokenize", "end_to_end"):
        dt, us = best[comparison]["datatrove"], best[comparison]["ours"]
        dt_tps = dt["figures"]["tokens"] / dt["seconds"]
        us_tps = us["figures"]["tokens"] / us["seconds"]
        result[comparison] = {
            "input": plan[comparison][1], "input_mb": inputs[plan[comparison][1]]["mb"],
            "datatrove": _side(dt, tokens_per_s=round(dt_tps)), "ours": _side(us, tokens_per_s=round(us_tps)),
            "tokens_per_s_ratio": _ratio(us_tps, dt_tps),
            "speed_ratio": _ratio(dt["seconds"], us["seconds"]),
            "full_cores": full_cores(dt["seconds"], us["cpu_seconds_min"], cores),
            "peak_rss_ratio": _ratio(dt["peak_rss_mib"], us["peak_rss_mib"]),
        }
    dt_total = best["dedup"]["datatrove"]["seconds"] + best["end_to_end"]["datatrove"]["seconds"]
    us_total = best["dedup"]["ours"]["seconds"] + best["end_to_end"]["ours"]["seconds"]
    us_cpu = best["dedup"]["ours"]["cpu_seconds_min"] + best["end_to_end"]["ours"]["cpu_seconds_min"]
    result["with_dedup"] = {"datatrove_seconds": round(dt_total, 3), "ours_seconds": round(us_total, 3),
                            "speed_ratio": _ratio(dt_total, us_total), "full_cores": full_cores(dt_total, us_cpu, cores)}
    result["ratios"] = {
        "dedup_speed": result["dedup"]["speed_ratio"], "dedup_peak_rss": result["dedup"]["peak_rss_ratio"],
        "tokenize_tokens_per_s": result["tokenize"]["tokens_per_s_ratio"],
        "tokenize_peak_rss": result["tokenize"]["peak_rss_ratio"],
        "end_to_end_tokens_per_s": result["end_to_end"]["tokens_per_s_ratio"],
        "end_to_end_speed": result["end_to_end"]["speed_ratio"],
        "end_to_end_peak_rss": result["end_to_end"]["peak_rss_ratio"],
        "with_dedup_speed": result["with_dedup"]["speed_ratio"],
        "speed_ceilings": {c: result[c]["full_cores"]["speed_ratio_ceiling"]
                           for c in ("dedup", "tokenize", "end_to_end", "with_dedup")},
        "meaning": "every ratio >= 1 means ours is at least as fast (or uses no more peak memory) as datatrove; "
                   "a speed ceiling is the most a speed ratio could be with our measured CPU work spread over every "
                   "core",
    }
    return result


if __name__ == "__main__":
    res = main()
    if res:
        print(json.dumps(res, indent=2))
