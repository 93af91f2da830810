"""Megatron .bin/.idx writer and index parser (SPEC §7)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from megacpp_core.megatron import (
    IndexFormatError,
    megatron_dtype,
    read_document,
    read_index,
    write_indexed_dataset,
)

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
