"""Megatron .bin/.idx writer and index parser (SPEC §7)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

import megacpp_core.megatron as megatron_mod
import megacpp_core.megatron_merge as merge_mod
from megacpp_core.megatron import (
    IndexDtypeMismatchError,
    IndexFormatError,
    RawIndexedDatasetBuilder,
    megatron_dtype,
    read_document,
    read_index,
    write_indexed_dataset,
)
from megacpp_core.megatron_merge import merge_indexed_datasets

torch = pytest.importorskip("torch")
indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")

CASES = [(300, np.uint16), (131072, np.int32)]


def random_docs(vocab_size: int, n: int = 40, seed: int = 0) -> list[np.ndarray]:
    """``n`` uint32 documents of 0..63 ids (one empty) in [0, vocab_size), each BOS-led."""
    rng = np.random.default_rng(seed)
    docs = [np.concatenate([[2], rng.integers(0, vocab_size, rng.integers(0, 64))]).astype(np.uint32)
            for _ in range(n)]
    docs[3] = np.empty(0, dtype=np.uint32)
    docs[5][-1] = vocab_size - 1
    return docs


def builder_reference(prefix: str, docs: list[np.ndarray], dtype) -> None:
    """Write ``docs`` with megatron-core's own builder, one item + end_document per document."""
    builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        builder.add_item(torch.from_numpy(doc.astype(np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def test_megatron_dtype_cutoff():
    assert megatron_dtype(65499) == np.uint16
    assert megatron_dtype(65500) == np.int32
    assert megatron_dtype(131072) == np.int32


@pytest.mark.parametrize("vocab_size,dtype", CASES)
@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_byte_identical_to_megatron_builder(tmp_path, vocab_size, dtype, backend):
    docs = random_docs(vocab_size)
    builder_reference(str(tmp_path / "ref"), docs, dtype)
    stats = write_indexed_dataset(tmp_path / "ours", docs, vocab_size, backend=backend)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()
    assert stats["backend"] == backend
    assert stats["dtype"] == np.dtype(dtype).name
    assert stats["documents"] == stats["sequences"] == len(docs)
    assert stats["tokens"] == sum(d.size for d in docs)


def test_auto_backend_uses_megatron(tmp_path):
    assert write_indexed_dataset(tmp_path / "p", random_docs(300), 300)["backend"] == "megatron"


@pytest.mark.parametrize("vocab_size,dtype", CASES)
def test_megatron_reads_back(tmp_path, vocab_size, dtype):
    docs = random_docs(vocab_size, seed=1)
    prefix = tmp_path / "p"
    write_indexed_dataset(prefix, docs, vocab_size, backend="raw")
    ds = indexed_dataset.IndexedDataset(str(prefix))
    assert ds.index.dtype is dtype
    assert len(ds) == len(docs)
    np.testing.assert_array_equal(ds.sequence_lengths, [d.size for d in docs])
    np.testing.assert_array_equal(ds.document_indices, np.arange(len(docs) + 1))
    info = read_index(f"{prefix}.idx")
    np.testing.assert_array_equal(info.sequence_pointers, ds.index.sequence_pointers)
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i], doc)
        got = read_document(prefix, i, info)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, doc)


@pytest.mark.parametrize("bad,match", [(300, "document 1: token id 300 >= vocab_size 300"),
                                       (-1, "document 1: negative token id -1")])
def test_out_of_range_ids_rejected_before_writing(tmp_path, bad, match):
    docs = [np.array([2, 5], dtype=np.int64), np.array([2, bad], dtype=np.int64)]
    with pytest.raises(ValueError, match=match):
        write_indexed_dataset(tmp_path / "p", docs, 300, backend="raw")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_atomic_write(tmp_path, backend):
    prefix = tmp_path / "p"
    write_indexed_dataset(prefix, [np.array([2, 7], dtype=np.uint32)], 300, backend=backend)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def exploding():
        yield np.array([2, 9, 9], dtype=np.uint32)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_indexed_dataset(prefix, exploding(), 300, backend=backend)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

    fresh = tmp_path / "fresh" / "q"
    with pytest.raises(RuntimeError):
        write_indexed_dataset(fresh, exploding(), 300, backend=backend)
    assert list(fresh.parent.iterdir()) == []


def _corrupt(raw: bytes, case: str) -> bytes:
    """Break one rule of a 3-document uint16 index (header 34 bytes, S = 3, D = 4)."""
    lengths_end = 34 + 3 * 4
    if case == "truncated":
        return raw[:-1]
    if case == "pointer":
        return raw[:lengths_end + 8] + struct.pack("<q", 999) + raw[lengths_end + 16:]
    if case == "doc-end":
        return raw[:-8] + struct.pack("<q", 2)
    if case == "doc-start":
        start = lengths_end + 3 * 8
        return raw[:start] + struct.pack("<q", 1) + raw[start + 8:]
    raise AssertionError(case)


@pytest.mark.parametrize("case,match", [
    ("truncated", "require"),
    ("pointer", "sequence pointer 1 is 999"),
    ("doc-end", "end at 2, expected the sequence count 3"),
    ("doc-start", "must start with 0"),
])
def test_read_index_rejects_inconsistent_index(tmp_path, case, match):
    prefix = tmp_path / "p"
    write_indexed_dataset(prefix, [np.array([2, 1, 1], dtype=np.uint32)] * 3, 300, backend="raw")
    idx = tmp_path / "p.idx"
    idx.write_bytes(_corrupt(idx.read_bytes(), case))
    with pytest.raises(IndexFormatError, match=match) as err:
        read_index(idx)
    assert str(idx) in str(err.value)


def test_auto_falls_back_to_raw(tmp_path, monkeypatch):
    import megacpp_core.megatron as m

    monkeypatch.setattr(m, "_megatron_builder_class", lambda: None)
    assert write_indexed_dataset(tmp_path / "p", random_docs(300), 300)["backend"] == "raw"
    with pytest.raises(ImportError):
        write_indexed_dataset(tmp_path / "q", random_docs(300), 300, backend="megatron")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.bin", "p.idx"]


# --- per-shard merge (add_index) -------------------------------------------------------------


def pair_bytes(prefix) -> tuple[bytes, bytes]:
    """The ``.bin`` and ``.idx`` bytes of ``prefix``."""
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def write_shards(directory: Path, groups: list[list[np.ndarray]], vocab_size: int, backend: str = "raw") -> list[Path]:
    """One dataset per group of documents, ``directory/shard{k}``."""
    prefixes = [directory / f"shard{k}" for k in range(len(groups))]
    for prefix, docs in zip(prefixes, groups):
        write_indexed_dataset(prefix, docs, vocab_size, backend=backend)
    return prefixes


def multi_sequence_shard(prefix: str, rng: np.random.Generator, dtype, n_docs: int) -> list[list[np.ndarray]]:
    """A shard written by megatron-core's builder whose documents hold 1-3 sequences each."""
    builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    docs = []
    for _ in range(n_docs):
        seqs = [rng.integers(0, 300, rng.integers(0, 20)).astype(np.int64) for _ in range(rng.integers(1, 4))]
        for seq in seqs:
            builder.add_item(torch.from_numpy(seq))
        builder.end_document()
        docs.append(seqs)
    builder.finalize(prefix + ".idx")
    return docs


def assert_nothing_written(directory: Path, name: str = "out") -> None:
    assert not [p.name for p in directory.iterdir() if p.name.startswith(name)]


@pytest.mark.parametrize("vocab_size,dtype", CASES)
@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_merge_of_shards_equals_one_write(tmp_path, vocab_size, dtype, backend):
    docs = random_docs(vocab_size, n=40, seed=2)
    whole = write_indexed_dataset(tmp_path / "whole", docs, vocab_size, backend=backend)
    shards = write_shards(tmp_path, [docs[:13], docs[13:27], docs[27:]], vocab_size)
    merged = merge_indexed_datasets(shards, tmp_path / "merged", vocab_size, backend=backend)
    assert pair_bytes(tmp_path / "merged") == pair_bytes(tmp_path / "whole")
    assert merged == whole
    assert merged["dtype"] == np.dtype(dtype).name and merged["backend"] == backend


def test_megatron_and_raw_merges_identical(tmp_path):
    """Multi-sequence documents (written by megatron-core) merged three ways give one result."""
    rng = np.random.default_rng(3)
    shards = [str(tmp_path / f"s{k}") for k in range(3)]
    docs = [doc for prefix, n in zip(shards, (4, 0, 7)) for doc in multi_sequence_shard(prefix, rng, np.uint16, n)]
    reference = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for prefix in shards:
        reference.add_index(prefix)
    reference.finalize(str(tmp_path / "ref.idx"))
    raw = merge_indexed_datasets(shards, tmp_path / "raw", 300, backend="raw")
    mc = merge_indexed_datasets(shards, tmp_path / "mc", 300, backend="megatron")
    assert pair_bytes(tmp_path / "raw") == pair_bytes(tmp_path / "mc") == pair_bytes(tmp_path / "ref")
    assert {**raw, "backend": "megatron"} == mc
    assert raw["documents"] == len(docs) == 11
    assert raw["sequences"] == sum(len(d) for d in docs) > raw["documents"]
    ds = indexed_dataset.IndexedDataset(str(tmp_path / "raw"))
    np.testing.assert_array_equal(ds.document_indices, np.cumsum([0] + [len(d) for d in docs]))
    flat = [seq for doc in docs for seq in doc]
    for i, seq in enumerate(flat):
        np.testing.assert_array_equal(ds[i], seq)


def test_raw_add_index_matches_megatron_builder_mid_document(tmp_path):
    """Items added before add_index without end_document join the first appended document."""
    write_indexed_dataset(tmp_path / "a", random_docs(300, n=8, seed=4), 300, backend="raw")
    write_indexed_dataset(tmp_path / "b", random_docs(300, n=6, seed=5), 300, backend="raw")
    raw = RawIndexedDatasetBuilder(tmp_path / "raw.bin", np.uint16)
    mc = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.uint16)
    for step in ("item", "a", "item", "end", "b", "item", "end"):
        for builder in (raw, mc):
            if step == "item":
                builder.add_item(torch.tensor([2, 7, 9]))
            elif step == "end":
                builder.end_document()
            else:
                builder.add_index(str(tmp_path / step))
    raw.finalize(tmp_path / "raw.idx")
    mc.finalize(str(tmp_path / "mc.idx"))
    assert pair_bytes(tmp_path / "raw") == pair_bytes(tmp_path / "mc")
    np.testing.assert_array_equal(read_index(tmp_path / "raw.idx").document_indices[:3], [0, 2, 3])


@pytest.mark.parametrize("vocab_size,dtype", CASES)
def test_megatron_reads_merged(tmp_path, vocab_size, dtype):
    docs = random_docs(vocab_size, n=30, seed=6)
    shards = write_shards(tmp_path, [docs[:1], docs[1:20], docs[20:]], vocab_size)
    merge_indexed_datasets(shards, tmp_path / "merged", vocab_size)
    ds = indexed_dataset.IndexedDataset(str(tmp_path / "merged"))
    assert ds.index.dtype is dtype
    assert len(ds) == len(docs)
    np.testing.assert_array_equal(ds.sequence_lengths, [d.size for d in docs])
    np.testing.assert_array_equal(ds.document_indices, np.arange(len(docs) + 1))
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i], doc)
        np.testing.assert_array_equal(read_document(tmp_path / "merged", i), doc)


@pytest.mark.parametrize("vocab_size", [300, 131072])
def test_merge_streams_bin_in_bounded_reads(tmp_path, monkeypatch, vocab_size):
    """Every .bin read is at most COPY_CHUNK_BYTES (patched to an odd 7 bytes), never whole."""
    docs = random_docs(vocab_size, n=20, seed=7)
    write_indexed_dataset(tmp_path / "whole", docs, vocab_size, backend="raw")
    shards = write_shards(tmp_path, [docs[:8], docs[8:]], vocab_size)
    monkeypatch.setattr(megatron_mod, "COPY_CHUNK_BYTES", 7)
    reads: list[int] = []

    class Spy:
        def __init__(self, f):
            self._f = f

        def read(self, n=-1):
            assert n is not None and 0 < n <= 7, f"unbounded read({n})"
            data = self._f.read(n)
            reads.append(len(data))
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def spy_open(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        return Spy(f) if ".bin" in Path(path).name and "r" in mode else f  # shards and the merged .bin.tmp

    monkeypatch.setattr(megatron_mod, "open", spy_open, raising=False)
    monkeypatch.setattr(merge_mod, "open", spy_open, raising=False)
    merge_indexed_datasets(shards, tmp_path / "merged", vocab_size, backend="raw")
    assert pair_bytes(tmp_path / "merged") == pair_bytes(tmp_path / "whole")
    total = Path(tmp_path / "whole.bin").stat().st_size
    assert sum(reads) == 2 * total and max(reads) <= 7  # copy pass + hash/check pass


@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_merge_rejects_mixed_dtypes(tmp_path, backend):
    [small], big = write_shards(tmp_path, [random_docs(300, n=6)], 300), tmp_path / "big"
    write_indexed_dataset(big, random_docs(131072, n=6), 131072, backend="raw")
    with pytest.raises(IndexDtypeMismatchError, match="index dtype int32 .*expected uint16") as err:
        merge_indexed_datasets([small, big], tmp_path / "out", 300, backend=backend)
    assert str(big) + ".idx" in str(err.value)
    assert isinstance(err.value, ValueError)
    assert_nothing_written(tmp_path)
    builder = RawIndexedDatasetBuilder(tmp_path / "b.bin", np.uint16) if backend == "raw" else \
        megatron_mod._MegatronBuilder(tmp_path / "b.bin", np.dtype(np.uint16))
    builder.add_index(small)
    with pytest.raises(IndexDtypeMismatchError):
        builder.add_index(big)
    builder.close()


@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_merge_zero_shards_is_the_empty_dataset(tmp_path, backend):
    stats = merge_indexed_datasets([], tmp_path / "out", 300, backend=backend)
    assert stats == write_indexed_dataset(tmp_path / "ref", [], 300, backend=backend)
    assert pair_bytes(tmp_path / "out") == pair_bytes(tmp_path / "ref") == (b"", pair_bytes(tmp_path / "ref")[1])
    info = read_index(tmp_path / "out.idx")
    assert (info.sequence_count, info.document_count, info.token_count) == (0, 0, 0)
    np.testing.assert_array_equal(info.document_indices, [0])


@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_merge_empty_shards_add_nothing(tmp_path, backend):
    """A shard with no documents adds nothing; one with an empty document adds that document."""
    docs = random_docs(300, n=10, seed=8)
    empty_doc = [np.empty(0, dtype=np.uint32)]
    shards = write_shards(tmp_path, [[], docs[:5], empty_doc, [], docs[5:], []], 300)
    stats = merge_indexed_datasets(shards, tmp_path / "out", 300, backend=backend)
    assert stats == write_indexed_dataset(tmp_path / "ref", docs[:5] + empty_doc + docs[5:], 300, backend=backend)
    assert pair_bytes(tmp_path / "out") == pair_bytes(tmp_path / "ref")
    assert stats["documents"] == 11


@pytest.mark.parametrize("missing", [".idx", ".bin"])
@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_merge_missing_file_raises_with_path(tmp_path, backend, missing):
    shards = write_shards(tmp_path, [random_docs(300, n=6), random_docs(300, n=7)], 300)
    gone = Path(f"{shards[1]}{missing}")
    gone.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(gone))):
        merge_indexed_datasets(shards, tmp_path / "out", 300, backend=backend)
    assert_nothing_written(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(str(gone))):
        RawIndexedDatasetBuilder(tmp_path / "b.bin", np.uint16).add_index(shards[1])


def test_merge_rejects_bin_of_wrong_size(tmp_path):
    shards = write_shards(tmp_path, [random_docs(300, n=6), random_docs(300, n=7)], 300)
    bin_file = Path(f"{shards[0]}.bin")
    bin_file.write_bytes(bin_file.read_bytes()[:-2])
    with pytest.raises(ValueError, match=re.escape(f"{bin_file}: ") + ".* bytes, but"):
        merge_indexed_datasets(shards, tmp_path / "out", 300)
    assert_nothing_written(tmp_path)


def test_merge_rejects_multimodal_shard(tmp_path):
    builder = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "mm.bin"), dtype=np.uint16, multimodal=True)
    builder.add_item(torch.tensor([2, 3]), mode=1)
    builder.end_document()
    builder.finalize(str(tmp_path / "mm.idx"))
    with pytest.raises(ValueError, match="multimodal"):
        merge_indexed_datasets([tmp_path / "mm"], tmp_path / "out", 300)


@pytest.mark.parametrize("backend", ["raw", "megatron"])
def test_merge_rejects_ids_outside_vocab_atomically(tmp_path, backend):
    """Shards of the right dtype but a larger vocabulary: the merge fails, naming the shard."""
    write_indexed_dataset(tmp_path / "out", [np.array([2, 1], dtype=np.uint32)], 300, backend="raw")
    before = pair_bytes(tmp_path / "out")
    bad = [np.array([2, 5], dtype=np.uint32), np.array([2, 299, 999, 7], dtype=np.uint32)]
    shards = write_shards(tmp_path, [random_docs(300, n=6), bad], 1000)
    with pytest.raises(ValueError, match=re.escape(f"shard 1 ({shards[1]}): token id 999 outside [0, 300) at token 4")):
        merge_indexed_datasets(shards, tmp_path / "out", 300, backend=backend)
    assert pair_bytes(tmp_path / "out") == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out.bin", "out.idx"]


def test_merge_argument_errors(tmp_path, monkeypatch):
    shards = write_shards(tmp_path, [random_docs(300, n=6)], 300)
    with pytest.raises(TypeError, match="single path"):
        merge_indexed_datasets(shards[0], tmp_path / "out", 300)
    with pytest.raises(ValueError, match="backend"):
        merge_indexed_datasets(shards, tmp_path / "out", 300, backend="fast")
    monkeypatch.setattr(megatron_mod, "_megatron_builder_class", lambda: None)
    with pytest.raises(ImportError):
        merge_indexed_datasets(shards, tmp_path / "out", 300, backend="megatron")
    assert_nothing_written(tmp_path)
    assert merge_indexed_datasets(shards, tmp_path / "out", 300)["backend"] == "raw"


def test_merge_into_one_of_its_inputs(tmp_path):
    docs = random_docs(300, n=12, seed=9)
    write_indexed_dataset(tmp_path / "whole", docs, 300, backend="raw")
    shards = write_shards(tmp_path, [docs[:6], docs[6:]], 300)
    merge_indexed_datasets(shards, shards[0], 300)
    assert pair_bytes(shards[0]) == pair_bytes(tmp_path / "whole")


@pytest.mark.parametrize("vocab_size,dtype", CASES)
def test_add_documents_equals_megatron_builder_per_document(tmp_path, vocab_size, dtype):
    """Whole arrays per group of documents (an empty one among them) give the bytes of
    megatron-core's builder fed one add_item + end_document per document; an item added
    before, without end_document, joins the first appended document there too."""
    docs = random_docs(vocab_size, n=40, seed=8)
    builder_reference(str(tmp_path / "ref"), docs, dtype)
    raw = RawIndexedDatasetBuilder(tmp_path / "raw.bin", dtype)
    for group in (docs[:1], docs[1:3], [], docs[3:25], docs[25:]):
        flat = np.concatenate(group) if group else np.zeros(0, np.uint32)
        raw.add_documents(flat, [d.size for d in group])
    raw.finalize(tmp_path / "raw.idx")
    assert pair_bytes(tmp_path / "raw") == pair_bytes(tmp_path / "ref")

    raw = RawIndexedDatasetBuilder(tmp_path / "mid.bin", np.uint16)
    mc = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.uint16)
    raw.add_item(np.array([2, 7]))
    raw.add_documents(np.array([2, 5, 2, 6, 6], np.uint32), [2, 3])
    mc.add_item(torch.tensor([2, 7]))
    for seq in ([2, 5], [2, 6, 6]):
        mc.add_item(torch.tensor(seq))
        mc.end_document()
    raw.finalize(tmp_path / "mid.idx")
    mc.finalize(str(tmp_path / "mc.idx"))
    assert pair_bytes(tmp_path / "mid") == pair_bytes(tmp_path / "mc")
    np.testing.assert_array_equal(read_index(tmp_path / "mid.idx").document_indices, [0, 2, 3])


def test_add_documents_rejects_lengths_that_do_not_split_the_tokens(tmp_path):
    raw = RawIndexedDatasetBuilder(tmp_path / "x.bin", np.int32)
    for tokens, lengths in (([1, 2, 3], [1, 1]), ([1, 2], [3, -1]), ([[1, 2]], [2])):
        with pytest.raises(ValueError, match="do not split"):
            raw.add_documents(np.array(tokens), lengths)
    raw.finalize(tmp_path / "x.idx")
    assert (tmp_path / "x.bin").stat().st_size == 0 and read_index(tmp_path / "x.idx").sequence_count == 0
