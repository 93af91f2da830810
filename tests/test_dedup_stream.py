"""Stage 4 partitioned (megacpp_core.dedup_stream, lsh_stream, dedup_index, spill): the
same bytes as the in-memory reference (megacpp_core.dedup.deduplicate_columns) on a
snapshot with exact, near and cross-source duplicates, whatever the shard count and the
bucket size; hostile inputs get clear errors; the committed tables are validated row
group by row group."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_checks.schemas import dedup as dedup_schema
from megacpp_checks.schemas import minhash as minhash_schema
from megacpp_core import catalog, dedup, dedup_stream, lsh_stream, spill
from megacpp_core import minhash as mh
from megacpp_core.dedup_index import DedupInputError, KeepIndex, sha_words
from megacpp_core.runner import InputRef
from megacpp_core.signatures import signatures_table
from megacpp_core.spill import BucketSpill, bucket_count, bucket_of
from megacpp_core.stage import Partition
from megacpp_core.storage import DataRoot
from megacpp_core.tables import write_parquet

SOURCES = ("alpha", "beta", "gamma-1", "gamma")  # "gamma-1/" sorts before "gamma/": doc_key order is not name order
WORDS = [f"w{i}" for i in range(400)]


def _corpus(seed: int = 0) -> list[dict]:
    """Files of four sources: unrelated texts, exact copies across sources, near copies
    within a source and across sources, a token-less file and a license mix."""
    rng = np.random.default_rng(seed)
    base = [" ".join(rng.choice(WORDS, 220).tolist()) + "\n" for _ in range(60)]

    def near(text: str) -> str:
        toks = text.split()
        for at in rng.choice(len(toks), 4, replace=False).tolist():
            toks[at] = "x" + toks[at]
        return " ".join(toks) + "\n"

    files = []
    for s, name in enumerate(SOURCES):
        for i in range(30):
            pick = int(rng.integers(0, len(base)))
            kind = rng.integers(0, 4)
            text = base[pick] if kind == 0 else near(base[pick]) if kind == 1 else " ".join(rng.choice(WORDS, 200).tolist())
            if i == 7:
                text = "/* */ ;;; {}\n"  # no token: an empty signature
            files.append({"source": name, "source_order": s, "path": f"src/d{i % 5}/f{i:03d}.c",
                          "license_class": ("permissive", "gpl2", "weak_copyleft")[i % 3], "text": text})
    for f in files:
        f["doc_key"] = f"{f['source']}/{f['path']}"
        f["content_sha256"] = hashlib.sha256(f["text"].encode()).hexdigest()
    return files


def _write(tmp_path, files: list[dict], shards: int) -> tuple[list[InputRef], list[InputRef]]:
    """Scrubbed and minhash shards of ``files`` under a data root, ``shards`` per source (by
    a hash of the path); returns the input references in manifest then shard order."""
    root = DataRoot(tmp_path / "root")
    scrubbed, minhash = [], []
    for name in SOURCES:
        mine = [f for f in files if f["source"] == name]
        for k in range(shards):
            part = [f for f in mine if int(hashlib.sha256(f["path"].encode()).hexdigest(), 16) % shards == k]
            p = Partition("snap", name, f"{k:03d}")
            cols = ["doc_key", "source", "source_order", "path", "license_class", "content_sha256", "text"]
            t = pa.table({c: pa.array([f[c] for f in part], pa.int32() if c == "source_order" else pa.string())
                          for c in cols})
            write_parquet(t, root.local_path(catalog.SCRUBBED.key(p)))
            sig = mh.signatures([f["text"] for f in part]) if part else np.zeros((0, 128), np.uint32)
            write_parquet(signatures_table([f["doc_key"] for f in part], sig), root.local_path(catalog.MINHASH.key(p)))
            scrubbed.append(InputRef(root, catalog.SCRUBBED, p))
            minhash.append(InputRef(root, catalog.MINHASH, p))
    return scrubbed, minhash


def _reference(files: list[dict], tmp_path, cross_pairs: np.ndarray | None = None) -> tuple[bytes, bytes, dict]:
    docs = pa.table({c: [f[c] for f in files] for c in ("doc_key", "source", "source_order", "path", "license_class",
                                                         "content_sha256")})
    texts = {f["doc_key"]: f["text"] for f in files}
    out = dedup.deduplicate_columns(docs, mh.signatures([f["text"] for f in files]), cross_pairs=cross_pairs,
                                    load_texts=lambda want: ((k, texts[k]) for k in sorted(want)))
    d = write_parquet(out.decisions, tmp_path / "ref-decisions.parquet").read_bytes()
    c = write_parquet(out.clusters, tmp_path / "ref-clusters.parquet").read_bytes()
    return d, c, out.figures


def _partitioned(tmp_path, files, shards: int, bucket_rows: int) -> tuple[bytes, bytes, dict]:
    scrubbed, minhash = _write(tmp_path / f"s{shards}-b{bucket_rows}", files, shards)
    work = tmp_path / f"work-{shards}-{bucket_rows}"
    order = {name: i for i, name in enumerate(SOURCES)}
    pair_files = []
    for lo, hi in catalog.LSH_PAIRS:
        out = work / f"pairs-{lo}.parquet"
        lsh_stream.band_range_pairs(minhash, order, lo, hi, dedup.CROSS_ROWS, 128, work / f"lsh-{lo}", out, bucket_rows)
        assert minhash_schema.validate_pairs_file(pq.ParquetFile(out))[0]
        pair_files.append(out)

    def pairs():
        for p in pair_files:
            t = pq.read_table(p)
            yield np.stack((t.column("row_a").to_numpy(), t.column("row_b").to_numpy()), axis=1)

    fig = dedup_stream.deduplicate_partitioned(scrubbed, minhash, pairs, work / "spill", work / "d.parquet",
                                               work / "c.parquet", bucket_rows=bucket_rows)
    ok, detail = dedup_schema.validate_decisions_files(pq.ParquetFile(work / "d.parquet"), pq.ParquetFile(work / "c.parquet"))
    assert ok, detail
    return (work / "d.parquet").read_bytes(), (work / "c.parquet").read_bytes(), fig


def test_partitioned_dedup_writes_the_reference_bytes_whatever_the_shards_and_buckets(tmp_path):
    files = _corpus()
    ref_d, ref_c, ref_fig = _reference(files, tmp_path)
    assert ref_fig["exact_removed"] and ref_fig["near_removed"] and ref_fig["cross_source_removed"]
    assert ref_fig["near_rejected_by_exact"] + ref_fig["cross_rejected_by_exact"] >= 0
    for shards, bucket_rows in ((1, dedup_stream.BUCKET_ROWS), (3, 5), (2, 1)):
        d, c, fig = _partitioned(tmp_path, files, shards, bucket_rows)
        assert d == ref_d and c == ref_c, (shards, bucket_rows)
        assert {k: fig[k] for k in ref_fig} == ref_fig
        assert fig["signatures_computed"] == 0 and fig["texts_read_for_verification"] > 0
        if bucket_rows < 10:
            assert fig["exact_buckets"] > 1


def test_lsh_buckets_give_the_in_memory_cross_source_candidates(tmp_path):
    files = _corpus(seed=3)
    _, minhash = _write(tmp_path, files, 2)
    order = {name: i for i, name in enumerate(SOURCES)}
    rows, src = [], []
    for ref in minhash:
        t = ref.read()
        rows.append(np.asarray(t.column("signature").combine_chunks().flatten()).reshape(-1, 128) if t.num_rows
                    else np.zeros((0, 128), np.uint32))
        src += [order[ref.source]] * t.num_rows
    sig, src = np.concatenate(rows), np.asarray(src)
    for lo, hi in catalog.LSH_PAIRS:
        want = dedup.cross_source_candidates(sig[:, lo * 8:hi * 8], src, 0, hi - lo)
        for bucket_rows in (1, 7, 1 << 20):
            out = tmp_path / f"p{lo}-{bucket_rows}.parquet"
            fig = lsh_stream.band_range_pairs(minhash, order, lo, hi, 8, 128, tmp_path / f"w{lo}-{bucket_rows}", out,
                                              bucket_rows)
            t = pq.read_table(out)
            got = np.stack((t.column("row_a").to_numpy(), t.column("row_b").to_numpy()), axis=1)
            assert np.array_equal(got, want) and fig["candidate_pairs"] == len(want)
            assert pq.ParquetFile(out).schema_arrow.metadata[lsh_stream.INPUTS_KEY.encode()].decode() == \
                lsh_stream.inputs_digest(minhash)
    assert len(want), "the corpus has cross-source candidates"


def test_spill_buckets_keep_append_order_and_spread_by_top_bits(tmp_path):
    assert bucket_count(0, 10) == 1 and bucket_count(10, 10) == 1 and bucket_count(11, 10) == 2
    assert bucket_count(1000, 10) == 128
    with pytest.raises(ValueError):
        bucket_count(5, 0)
    keys = np.array([0, 1 << 63, (1 << 62) + 5, (1 << 64) - 1], np.uint64)
    assert bucket_of(keys, 4).tolist() == [0, 2, 1, 3] and bucket_of(keys, 1).tolist() == [0, 0, 0, 0]
    with BucketSpill(tmp_path, 3, np.int64) as s:
        s.add(np.array([2, 0, 2, 1]), np.array([10, 11, 12, 13]))
        s.add(np.array([2]), np.array([14]))
        assert s.read(2).tolist() == [10, 12, 14] and s.read(0).tolist() == [11] and s.records == 5


def test_hostile_index_inputs_get_clear_errors(tmp_path):
    files = _corpus()[:40]
    with pytest.raises(DedupInputError, match="not a hex SHA-256"):
        sha_words(pa.array(["ABC"]))
    with pytest.raises(DedupInputError, match="not a lowercase hex"):
        sha_words(pa.array(["G" * 64]))
    with pytest.raises(DedupInputError, match="nulls"):
        sha_words(pa.array([None, "0" * 64]))
    assert sha_words(pa.array(["0" * 63 + "1", "f" * 64])).tolist() == [[0, 0, 0, 1], [2**64 - 1] * 4]

    bad = [dict(f) for f in files]
    bad[3]["doc_key"] = "elsewhere/x.c"
    scrubbed, minhash = _write(tmp_path / "a", bad, 1)
    with pytest.raises(DedupInputError, match="does not start with 'alpha/'"):
        KeepIndex(scrubbed, minhash, tmp_path / "wa", 128).build()
    dup = [dict(f) for f in files] + [dict(files[0])]
    scrubbed, minhash = _write(tmp_path / "b", dup, 1)
    with pytest.raises(DedupInputError, match="duplicate doc_key 'alpha/src/d0/f000.c'"):
        KeepIndex(scrubbed, minhash, tmp_path / "wb", 128).build()
    scrubbed, minhash = _write(tmp_path / "c", files, 2)
    with pytest.raises(DedupInputError, match="not in the order"):
        KeepIndex(scrubbed, list(reversed(minhash)), tmp_path / "wc", 128)
    with pytest.raises(DedupInputError, match="outside"):
        dedup_stream.deduplicate_partitioned(scrubbed, minhash, lambda: iter([np.array([[0, 10**6]])]), tmp_path / "wd",
                                             tmp_path / "d.parquet", tmp_path / "c.parquet")


def test_a_file_without_signature_gets_one_from_its_text(tmp_path):
    files = _corpus()
    scrubbed, minhash = _write(tmp_path, files, 1)
    t = pq.read_table(minhash[1].uri)  # a local root's uri is its path
    write_parquet(t.slice(1), minhash[1].uri)  # beta's first file loses its signature
    ref_d, ref_c, _ = _reference(files, tmp_path, cross_pairs=np.zeros((0, 2), np.int64))
    fig = dedup_stream.deduplicate_partitioned(scrubbed, minhash, lambda: iter(()), tmp_path / "w", tmp_path / "d.parquet",
                                               tmp_path / "c.parquet")
    assert fig["signatures_computed"] == 1 and fig["cross_source_removed"] == 0
    assert (tmp_path / "d.parquet").read_bytes() == ref_d and (tmp_path / "c.parquet").read_bytes() == ref_c


def test_streamed_validators_catch_broken_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(dedup_schema, "VALIDATE_ROWS", 5)  # batches of two 3-row groups: clusters cut across them
    files = _corpus()
    d, c, _ = _partitioned(tmp_path, files, 1, 4)
    dec, clu = pq.read_table(pa.BufferReader(d)), pq.read_table(pa.BufferReader(c))

    def check(decisions: pa.Table, clusters: pa.Table, rows: int = 16):
        write_parquet(decisions, tmp_path / "x-d.parquet", row_group_size=rows)
        write_parquet(clusters, tmp_path / "x-c.parquet", row_group_size=rows)
        return dedup_schema.validate_decisions_files(pq.ParquetFile(tmp_path / "x-d.parquet"),
                                                     pq.ParquetFile(tmp_path / "x-c.parquet"))

    assert check(dec, clu, rows=3)[0]  # clusters cut across row groups still validate whole
    ok, detail = check(dec.take(pa.array([1, 0] + list(range(2, dec.num_rows)))), clu)
    assert not ok and "ascending" in detail
    import pyarrow.compute as pc

    drops = np.flatnonzero(~dec.column("keep").to_numpy(zero_copy_only=False))
    twin = dec.column("kept_twin").to_pylist()
    twin[int(drops[0])] = dec.column("doc_key")[int(drops[1])].as_py()  # names a dropped file
    ok, detail = check(dec.set_column(3, "kept_twin", pa.array(twin, pa.string())), clu)
    assert not ok and "not a kept cluster head" in detail
    ok, detail = check(dec, clu.filter(pc.not_equal(clu.column("doc_key"), dec.column("doc_key")[int(drops[0])])))
    assert not ok


def test_key_hashes_need_no_polars_and_separate_close_keys():
    """The streamed validators compare keys as 64-bit BLAKE2b digests: a null, the empty
    key, keys differing by a trailing NUL or one character, and non-ASCII keys all differ;
    the same keys hash the same whether chunked or not; and the gate imports no polars
    (its import alone was 0.11–0.14 s of the dedup step)."""
    import subprocess
    import sys

    keys = pa.array(["a", "a\x00", "", None, "b", "é", "\U0001F600", "src/x.c", "src/x.cc"])
    h = dedup_schema._hashes(keys)
    assert h.dtype == np.uint64 and np.unique(h).size == len(keys)
    assert np.array_equal(dedup_schema._hashes(pa.chunked_array([keys[:4], keys[4:]])), h)
    assert np.array_equal(dedup_schema._hashes(pa.array(["b", "a"])), h[[4, 0]])
    code = ("import sys, pyarrow as pa; from megacpp_checks.schemas import dedup; "
            "dedup._hashes(pa.array(['k'])); print('polars' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_key_group_pairs_in_blocks_equal_all_pairs():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 40, 600).astype(np.uint64)
    keys[:200] = 7  # one key shared by 200 rows (+ those drawn): copies of one file
    rows = rng.permutation(10_000)[:600].astype(np.int64)
    want = np.unique(mh.bucket_pairs(keys, rows))
    for limit in (1, 13, 1000, 1 << 30):
        blocks = list(lsh_stream.key_group_pairs(keys, rows, limit))
        got = np.concatenate(blocks)
        assert len(got) == len(want) and np.array_equal(np.unique(got), want)
        if limit == 1000:
            assert max(len(b) for b in blocks) <= 1000  # a block stays within the limit


def test_without_exact_verification_no_text_is_read(tmp_path):
    """minhash_verify_exact off: decisions on the MinHash estimate alone, as the in-memory
    reference decides with verify_exact=False, and not one text is read."""
    files = _corpus()
    scrubbed, minhash = _write(tmp_path, files, 2)
    docs = pa.table({c: [f[c] for f in files] for c in ("doc_key", "source", "source_order", "path", "license_class",
                                                         "content_sha256")})
    ref = dedup.deduplicate_columns(docs, mh.signatures([f["text"] for f in files]), cross_pairs=np.zeros((0, 2), np.int64),
                                    verify_exact=False)
    for ref_in in scrubbed:  # a shard whose texts cannot be read: any text read fails
        t = pq.read_table(ref_in.uri)
        write_parquet(t.set_column(t.column_names.index("text"), "text", pa.array([None] * t.num_rows, pa.string())),
                      ref_in.uri)
    fig = dedup_stream.deduplicate_partitioned(scrubbed, minhash, lambda: iter(()), tmp_path / "w", tmp_path / "d.parquet",
                                               tmp_path / "c.parquet", verify_exact=False)
    assert fig["texts_read_for_verification"] == 0 and fig["verify_exact"] is False
    assert (tmp_path / "d.parquet").read_bytes() == write_parquet(ref.decisions, tmp_path / "r.parquet").read_bytes()
    assert ref.figures["near_removed"] > 0


def _synthetic_shards(tmp_path, files: int, per_source: int = 2000, per_shard: int = 1000):
    """Scrubbed and minhash shards of ``files`` files, sources of ``per_source`` files: a
    fifth exact copies across sources, random signatures (no near pair), short texts."""
    rng = np.random.default_rng(1)
    root = DataRoot(tmp_path / f"root-{files}")
    scrubbed, minhash = [], []
    pool = rng.integers(0, 2**32 - 1, (files // 10, 128), dtype=np.uint32)
    for s in range(files // per_source):
        name = f"s{s:04d}"
        copy = rng.random(per_source) < 0.2
        which = rng.integers(0, len(pool), per_source)
        sig = np.where(copy[:, None], pool[which], rng.integers(0, 2**32 - 1, (per_source, 128), dtype=np.uint32))
        sha = [f"{w:064x}" if c else hashlib.sha256(f"{name}/{i}".encode()).hexdigest()
               for i, (c, w) in enumerate(zip(copy.tolist(), which.tolist()))]
        for k in range(per_source // per_shard):
            lo, hi = k * per_shard, (k + 1) * per_shard
            p = Partition("snap", name, f"{k:03d}")
            keys = [f"{name}/f{i:05d}.c" for i in range(lo, hi)]
            write_parquet(pa.table({"doc_key": keys, "source": [name] * per_shard,
                                    "source_order": pa.array([s] * per_shard, pa.int32()),
                                    "path": [k_.split("/", 1)[1] for k_ in keys], "license_class": ["permissive"] * per_shard,
                                    "content_sha256": sha[lo:hi], "text": ["x\n"] * per_shard}),
                          root.local_path(catalog.SCRUBBED.key(p)))
            write_parquet(signatures_table(keys, sig[lo:hi]), root.local_path(catalog.MINHASH.key(p)))
            scrubbed.append(InputRef(root, catalog.SCRUBBED, p))
            minhash.append(InputRef(root, catalog.MINHASH, p))
    return scrubbed, minhash


def test_memory_per_file_is_a_few_bytes_not_the_signature(tmp_path, monkeypatch):
    """Traced (Python and numpy) peak of the partitioned dedup on 8,000 and 32,000 files
    with the same source size and bucket size: the difference per added file stays below
    32 bytes (11 bytes of state per file, plus the exact copies' drop arrays). The
    in-memory reference holds the 512-byte signature and more per file."""
    import tracemalloc

    monkeypatch.setattr(spill, "BUFFER_BYTES", 1 << 16)  # a constant 8 MiB by default: it would hide the per-file term
    peaks = {}
    for n in (2000, 8000, 32000):  # the first run imports what the passes use (not measured)
        scrubbed, minhash = _synthetic_shards(tmp_path, n)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            fig = dedup_stream.deduplicate_partitioned(scrubbed, minhash, lambda: iter(()), tmp_path / f"w{n}",
                                                       tmp_path / f"d{n}.parquet", tmp_path / f"c{n}.parquet",
                                                       bucket_rows=2048, verify_exact=False)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert fig["files_in"] == n and fig["exact_removed"] > n // 10 and fig["exact_buckets"] > (n > 2048)
    assert peaks[8000] > 0
    per_file = (peaks[32000] - peaks[8000]) / 24000
    assert per_file < 32, f"{per_file:.1f} traced bytes per added file ({peaks})"


def test_stale_or_foreign_signatures_and_an_empty_snapshot(tmp_path):
    """A signature of no scrubbed file, a second signature of one file and a file that names
    another source are refused by name; an empty snapshot gives empty tables."""
    files = _corpus()[:40]

    def run(scrubbed, minhash, name):
        return dedup_stream.deduplicate_partitioned(scrubbed, minhash, lambda: iter(()), tmp_path / f"w-{name}",
                                                    tmp_path / f"d-{name}.parquet", tmp_path / f"c-{name}.parquet")

    scrubbed, minhash = _write(tmp_path / "a", files, 1)
    t = pq.read_table(minhash[0].uri)
    write_parquet(pa.concat_tables([t, t.slice(2, 1)]), minhash[0].uri)  # alpha's third file signed twice
    with pytest.raises(DedupInputError, match="a second signature of 'alpha/"):
        run(scrubbed, minhash, "a")

    scrubbed, minhash = _write(tmp_path / "b", files, 1)
    t = pq.read_table(minhash[0].uri)
    write_parquet(signatures_table(["alpha/src/gone.c"] + t.column("doc_key").to_pylist()[1:],
                                   mh.signatures(["gone"] + [f["text"] for f in files if f["source"] == "alpha"][1:])),
                  minhash[0].uri)
    with pytest.raises(DedupInputError, match="'alpha/src/gone.c', no scrubbed file of alpha"):
        run(scrubbed, minhash, "b")

    scrubbed, minhash = _write(tmp_path / "c", files, 1)  # beta's files gone, its signatures left
    t = pq.read_table(scrubbed[1].uri)
    write_parquet(t.slice(0, 0), scrubbed[1].uri)
    with pytest.raises(DedupInputError, match="no scrubbed file of beta"):
        run(scrubbed, minhash, "c")

    scrubbed, minhash = _write(tmp_path / "d", files, 1)
    t = pq.read_table(scrubbed[0].uri)
    write_parquet(t.set_column(1, "source", pa.array(["alpha"] * 2 + ["beta"] + ["alpha"] * (t.num_rows - 3))),
                  scrubbed[0].uri)
    with pytest.raises(DedupInputError, match="source alpha: a file of source 'beta'"):
        run(scrubbed, minhash, "d")

    fig = run([], [], "empty")
    assert fig["files_in"] == fig["files_out"] == 0
    assert pq.read_metadata(tmp_path / "d-empty.parquet").num_rows == 0
    assert pq.read_metadata(tmp_path / "c-empty.parquet").num_rows == 0


def test_spills_hold_no_file_handles_between_writes(tmp_path):
    """Under a 256-file limit the LSH step spills into 7 bands × 128 key buckets and as many
    pair buckets, and still gives the pairs of one wide bucket."""
    import resource

    files = _corpus()
    _, minhash = _write(tmp_path, files, 2)
    order = {name: i for i, name in enumerate(SOURCES)}
    lo, hi = next(iter(catalog.LSH_PAIRS))
    lsh_stream.band_range_pairs(minhash, order, lo, hi, dedup.CROSS_ROWS, 128, tmp_path / "wide", tmp_path / "p1.parquet",
                                1 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        fig = lsh_stream.band_range_pairs(minhash, order, lo, hi, dedup.CROSS_ROWS, 128, tmp_path / "narrow",
                                          tmp_path / "p2.parquet", 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert fig["key_buckets"] > 256 and fig["pair_buckets"] > 1
    assert pq.read_table(tmp_path / "p2.parquet").equals(pq.read_table(tmp_path / "p1.parquet"))
    with BucketSpill(tmp_path / "buf", 2, np.int64, buffer_bytes=16) as s:  # flushes every 2 records
        for v in range(7):
            s.add(np.array([v % 2]), np.array([v]))
    assert s.read(0).tolist() == [0, 2, 4, 6] and s.read(1).tolist() == [1, 3, 5]
