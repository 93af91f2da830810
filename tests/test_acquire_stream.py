"""Stage 0 streams a revision: names and sizes first, then the contents shard by shard in
bounded batches (megacpp_core.acquire_stream) — never the whole revision in memory, and
the same rows, in the same order and shards, as reading it whole."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_core import acquire, acquire_stream, sharding, stages
from megacpp_core.layout import SnapshotLayout
from megacpp_core.manifest import load_manifest

from .conftest import make_data_root


def _reference_shards(snapshot: str, source, shard_bytes: int, cache: Path) -> tuple[dict[str, pa.Table], pa.Table]:
    """What acquire wrote before it streamed: the whole revision read into memory, one
    table, split per shard by filtering; and the license texts taken from that table."""
    got = acquire.acquire_source(source, cache)
    table = acquire.source_files_table(snapshot, source, got)
    n, shard_of = sharding.assign(table.column("path").to_pylist(), table.column("size").to_pylist(), shard_bytes)
    col = pa.array(shard_of, type=pa.int32())
    return ({sharding.shard_key(i): table.filter(pc.equal(col, i)) for i in range(n)}, acquire.license_texts_table(table))


def _committed(layout: SnapshotLayout, source: str) -> dict[str, pa.Table]:
    """The committed shards of ``source`` in plan order (``content`` as written: large_binary)."""
    plan = sharding.shard_keys(json.loads((layout.revision(source) / "shards.json").read_text()))
    return {k: pq.read_table(layout.shard(source, k) / "source_files.parquet").cast(acquire.SOURCE_FILES_SCHEMA)
            for k in plan}


def _license_texts(layout: SnapshotLayout, source: str) -> pa.Table:
    return pq.read_table(layout.revision(source) / "license_texts.parquet").cast(acquire.LICENSE_TEXTS_SCHEMA)


def _no_whole_revision(monkeypatch) -> None:
    def whole_revision(*a, **k):
        raise AssertionError("acquire read a whole revision into memory")

    monkeypatch.setattr(acquire, "acquire_source", whole_revision)


def test_stage_streams_a_real_sdist_in_bounded_batches(tmp_path, monkeypatch):
    """pybind11 from ``tiny`` (a gzip sdist whose members are not in path order, so the
    contents go through the spill file) with an 8 KiB batch bound: the stage never reads
    the revision into memory, the shard file is appended in many batches, none holding
    more than the bound plus one file, and the rows and license texts are those of the
    whole revision read at once."""
    root = make_data_root(tmp_path / "root")
    m = load_manifest("tiny")
    src = m.source("pybind11-3.1.0")
    layout = SnapshotLayout(root, "tiny")
    want, want_licenses = _reference_shards("tiny", src, m.settings.shard_bytes, layout.cache)
    bound = 8 << 10
    monkeypatch.setattr(acquire_stream, "BATCH_BYTES", bound)
    _no_whole_revision(monkeypatch)
    res = stages.run("acquire", root, m, src)
    assert res.ok, res.checks
    got = _committed(layout, src.name)
    assert list(got) == list(want) and res.figures["files"] == sum(t.num_rows for t in want.values())
    for k, t in got.items():
        assert t.equals(want[k]), k
        meta = pq.ParquetFile(layout.shard(src.name, k) / "source_files.parquet").metadata
        assert meta.num_row_groups > 10  # many batches, one row group each
        sizes = t.column("size").to_pylist()
        start = 0
        for rg in range(meta.num_row_groups):
            rows = meta.row_group(rg).num_rows
            assert rows <= acquire_stream.BATCH_ROWS
            assert sum(sizes[start:start + rows - 1]) < bound  # cut as soon as the bound was reached
            start += rows
    assert _license_texts(layout, src.name).equals(want_licenses)
    assert not [p for p in (root / ".scratch").rglob("*") if p.is_file()], "spill or shard files left in scratch"


def test_stage_memory_follows_the_batch_not_the_revision(tmp_path, monkeypatch):
    """A 12 MiB revision (128 incompressible files in a gzip tar, not in path order) with a
    256 KiB batch bound: at no point does the stage (fetch, both passes, commit, schema
    check) hold a third of the revision in Python objects; reading the revision whole
    holds all of it."""
    noise = lambda n, seed: hashlib.shake_256(seed.encode()).digest(n)
    files = {f"big-1.0/src/f{i:03d}.cc": noise(96 << 10, str(i)) for i in range(128)}
    data = _archive(tmp_path / "big-1.0.tar.gz", dict(sorted(files.items(), reverse=True)))
    (tmp_path / "m.yaml").write_text(f"name: b\nsettings:\n  shard_bytes: 4000000\nsources:\n"
                                     f"  - {{name: big, kind: archive, path: big-1.0.tar.gz, "
                                     f"sha256: {hashlib.sha256(data).hexdigest()}}}\n")
    m = load_manifest(tmp_path / "m.yaml")
    root = tmp_path / "root"
    total = sum(len(d) for d in files.values())
    monkeypatch.setattr(acquire_stream, "BATCH_BYTES", 256 << 10)
    stages.run("acquire", root, m, m.sources[0])  # fetch into the cache, imports: not measured
    _no_whole_revision(monkeypatch)
    tracemalloc.start()
    try:
        res = stages.run("acquire", root, m, m.sources[0])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.ok and res.figures["bytes"] == total and res.figures["shards"] == 4, (res.checks, res.figures)
    assert peak < total / 3, f"the stage held {peak} bytes at once for a revision of {total} bytes"


def _archive(path: Path, files: dict[str, bytes]) -> bytes:
    """A zip, or a tar (``.tar`` plain, ``.tar.gz``/``.tar.xz`` compressed) of ``files`` in the given order."""
    if path.suffix == ".zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for n, d in files.items():
                zf.writestr(n, d)
    else:
        mode = {".tar": "w", ".gz": "w:gz", ".xz": "w:xz"}[path.suffix]
        with tarfile.open(path, mode) as tf:
            for n, d in files.items():
                ti = tarfile.TarInfo(n)
                ti.size = len(d)
                tf.addfile(ti, io.BytesIO(d))
    return path.read_bytes()


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz", ".tar", ".zip"])
def test_streamed_shards_equal_the_whole_revision_split(tmp_path, monkeypatch, suffix):
    """Members in reverse path order, several shards (one of them possibly empty), files
    larger than the batch bound: every shard holds the rows of the revision read at once,
    in path order, and the shard plan and figures count them alike."""
    noise = lambda n, seed: hashlib.shake_256(seed.encode()).digest(n)
    files = {f"lib-2.0/src/f{i:03d}.{'c' if i % 3 else 'h'}": noise(100 + 997 * i, str(i)) for i in range(60)}
    files["lib-2.0/LICENSE"] = b"MIT License\n"
    files["lib-2.0/big.cpp"] = noise(40_000, "big")
    files = dict(sorted(files.items(), reverse=True))
    data = _archive(tmp_path / f"lib-2.0{suffix}", files)
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "m.yaml").write_text(f"name: s\nsettings:\n  shard_bytes: 200000\nsources:\n"
                                     f"  - {{name: lib, kind: archive, path: lib-2.0{suffix}, sha256: {sha}}}\n")
    m = load_manifest(tmp_path / "m.yaml")
    root = tmp_path / "root"
    monkeypatch.setattr(acquire_stream, "BATCH_BYTES", 16 << 10)
    res = stages.run("acquire", root, m, m.sources[0])
    assert res.ok, res.checks
    layout = SnapshotLayout(root, "s")
    want, want_licenses = _reference_shards("s", m.sources[0], 200_000, layout.cache)
    got = _committed(layout, "lib")
    assert len(got) == res.figures["shards"] > 3 and list(got) == list(want)
    for k in want:
        assert got[k].equals(want[k]), k
        assert got[k].column("path").to_pylist() == sorted(got[k].column("path").to_pylist())
    assert "big.cpp" in pa.concat_tables(list(got.values())).column("path").to_pylist()  # the common root was stripped
    assert _license_texts(layout, "lib").equals(want_licenses) and want_licenses.num_rows == 1
    plan = json.loads((layout.revision("lib") / "shards.json").read_text())
    assert plan["files"] == [t.num_rows for t in want.values()] and res.figures["files"] == len(files)
    assert res.figures["bytes"] == sum(len(d) for d in files.values()) == sum(plan["bytes"])


def test_spill_refuses_a_member_shorter_than_its_header(tmp_path):
    """A compressed tar whose member is cut short fails while it is copied, naming it; no
    spill file is left behind."""
    from megacpp_core.archives import ArchiveSource

    arc = tmp_path / "cut.tar.gz"
    _archive(arc, {"pkg/b.c": b"int b;\n", "pkg/a.c": b"int a;\n" * 4096})
    raw = tarfile.open(arc).extractfile("pkg/a.c")  # sanity: the intact archive reads
    assert raw.read().startswith(b"int a;")
    import gzip

    body = gzip.decompress(arc.read_bytes())
    arc.write_bytes(gzip.compress(body[:512 * 3 + 1000]))  # headers of both, a.c truncated
    source = ArchiveSource(arc, arc.name, True, "0" * 64, "0" * 64, arc.name, True)
    spill = tmp_path / "spill"
    with pytest.raises((acquire.AcquireError, tarfile.ReadError)):
        with acquire_stream.ArchiveTree(source, acquire.ArchiveLimits(), spill) as tree:
            for i in acquire_stream.sorted_indices(tree):
                tree.read(i)
    assert not list(spill.glob("*"))


def test_write_shards_from_memory_writes_empty_shards_as_before(tmp_path):
    """Two files over 20 shards (a local or Debian source goes through the same writer from
    memory): every shard is a file, the 18 without a file hold no row and are
    byte-identical to the empty table written at once, as the stage wrote them before."""
    from megacpp_core.archives import Acquired
    from megacpp_core.manifest import Source
    from megacpp_core.tables import write_parquet_to

    files = [("b.c", b"int b;\n" * 3000), ("a.h", b"int a;\n" * 3000)]
    src = Source(name="mine", kind="local", order=0, version="v1", path=str(tmp_path))
    got = acquire_stream.write_shards(acquire_stream.MemoryTree(files), "l", src, Acquired([], "f" * 64, None, "dir", True),
                                      2100, tmp_path / "out")
    assert got.n == 20 and sum(got.shard_files) == 2 and sorted(got.files) == [sharding.shard_key(i) for i in range(20)]
    empty = io.BytesIO()
    write_parquet_to(acquire.SOURCE_FILES_SCHEMA.empty_table(), empty)
    rows = {}
    for k, path in got.files.items():
        t = pq.read_table(path)
        rows.update({p: k for p in t.column("path").to_pylist()})
        if t.num_rows == 0:
            assert path.read_bytes() == empty.getvalue(), k
    assert rows == {p: sharding.shard_key(sharding.shard_of(p, 20)) for p, _ in files}
