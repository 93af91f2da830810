"""Bounded-memory writing and the streamed curriculum documents: whole row groups through
an on-disk spool (``tables.ParquetStream(whole_row_groups=True)``), the three-pass
repository documents (``repo_documents.RevisionSpill``/``plan_pieces``/``piece_tables``),
the stage's keep-ordered output, and the batch-wise structure builder — on the real tiny
snapshot and on hostile input."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from megacpp_core import kept
from megacpp_core import repo_documents as rd
from megacpp_core import structure_documents as sd
from megacpp_core.tables import ParquetStream, write_parquet_to


def _rows(n: int, width: int = 300, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    vals = rng.integers(0, 1 << 17, size=n * width).astype(np.uint32)
    ids = pa.ListArray.from_arrays(pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)), pa.array(vals))
    return pa.table({"input_ids": ids, "row": pa.array(np.arange(n, dtype=np.int64)),
                     "key": pa.array([f"k{i:06d}" for i in range(n)])})


@pytest.mark.parametrize("sizes", [[1] * 40, [7, 13, 1, 19], [64], [3, 61], [32, 32], []])
def test_whole_row_groups_give_the_bytes_of_one_write_whatever_the_write_sizes(tmp_path, sizes):
    rows = _rows(sum(sizes))
    one = io.BytesIO()
    write_parquet_to(rows, one, row_group_size=16)
    path = tmp_path / "out.parquet"
    with ParquetStream(path, rows.schema, 16, whole_row_groups=True) as out:
        at = 0
        for n in sizes:
            out.write(rows.slice(at, n))
            at += n
    assert path.read_bytes() == one.getvalue()
    md = pq.ParquetFile(path).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)][:-1] == [16] * (md.num_row_groups - 1)
    assert not list(tmp_path.glob("*.spool")) and not list(tmp_path.glob("*.tmp"))


def test_rows_short_of_a_row_group_wait_on_disk_not_in_memory(tmp_path):
    """The rows between row groups are in the spool file (so the writer does not hold
    them); an error removes the spool and the temporary file, and nothing appears."""
    rows = _rows(20)
    path = tmp_path / "out.parquet"
    out = ParquetStream(path, rows.schema, 16, whole_row_groups=True)
    out.write(rows.slice(0, 10))
    spool = tmp_path / "out.parquet.spool"
    out._spool.close()  # flush the IPC footer to read what is on disk
    with pa.memory_map(str(spool)) as src:
        assert pa.ipc.open_file(src).read_all().equals(rows.slice(0, 10))
    out._spool = None
    out.abort()
    assert not path.exists() and not spool.exists() and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(RuntimeError):
        with ParquetStream(path, rows.schema, 16, whole_row_groups=True) as out:
            out.write(rows.slice(0, 5))
            raise RuntimeError("killed")
    assert not path.exists() and not list(tmp_path.iterdir())


def _encode(strings):
    return [[256 + b for b in s.encode("utf-8", "surrogatepass")] for s in strings]


FILES = {
    "include/a.h": ("header", "int a(void);\n"),
    "src/a.c": ("c", '#include "a.h"\n#include <stdio.h>\nint a(void) { return 1; }\n'),
    "src/b.c": ("c", '#include "../include/a.h"\nint b(void) { return a(); }\n'),
    "big.c": ("c", "int big[] = {" + ",".join(["1"] * 400) + "};\n"),
    "bin.c": ("c", "\x00\x01 binary-ish \ufffd é€😀\n"),
}


def test_the_streamed_passes_over_several_shards_equal_the_pieces_of_one(tmp_path):
    """Spilling the files in several shards gives the same pieces as all at once; a file in
    two shards is refused."""
    whole = rd.revision_documents("r", FILES, _encode, bos_id=2, file_sep_id=7, budget=200)
    spill = rd.RevisionSpill(tmp_path / "s.arrow", _encode)
    names = sorted(FILES)
    spill.add({p: FILES[p] for p in names[:2]})
    spill.add({})
    spill.add({p: FILES[p] for p in names[2:]})
    with pytest.raises(ValueError, match="two shards"):
        spill.add({names[0]: FILES[names[0]]})
    spill.close()
    pieces, figs = rd.plan_pieces(spill, 200)
    assert figs == whole.figures and pieces.oversized == whole.oversized == ["big.c"]
    got = pa.concat_tables(list(rd.piece_tables("r", spill, pieces, bos_id=2, file_sep_id=7, batch=1)))
    assert got.equals(whole.table)
    back = list(rd.piece_tables("r", spill, pieces, bos_id=2, file_sep_id=7, which=[len(pieces.pieces) - 1, 0]))
    assert [t.column("piece_index").to_pylist() for t in back] == [[len(pieces.pieces) - 1, 0]]


def test_structure_builder_in_batches_equals_one_table():
    p3 = rd.revision_documents("r", {k: v for k, v in FILES.items() if k != "big.c"}, _encode, bos_id=2,
                               file_sep_id=27, budget=80)
    from megacpp_core import family_documents

    meta = {p: "permissive" for p in FILES}
    t = family_documents.repo_family_table(p3.table, meta, "rev")
    assert t.num_rows >= 3
    table = [b""] * 256 + [bytes([b]) for b in range(256)]
    table[2], table[27] = b"<BOS>", rd.FILE_SEP.encode()
    lengths = np.asarray([len(b) for b in table], dtype=np.int64)
    langs = {p: lang for p, (lang, _) in FILES.items()}
    one, figs = sd.structure_table(t, langs, {}, {}, None, table, lengths, 27)
    b = sd.StructureBuilder(langs, lambda p: ("", {}), None, table, lengths, 27)
    parts = [b.add(t.slice(i, 1)) for i in range(t.num_rows)]
    assert pa.concat_tables(parts).equals(one) and b.figures() == figs


def test_the_stage_writes_repository_documents_in_keep_order(tiny_run):
    """On the real tiny snapshot: every revision's ``p3_repo_documents`` and
    ``p4_structure_documents`` are stored in snapshot keep order (the family step and the
    export read them as stored, no re-sort of a revision), hold the same keys, and the
    pieces are those of the in-memory builder."""
    root, _ = tiny_run
    checked = 0
    for p3_path in sorted((root / "snapshots" / "tiny").glob("revisions/*/families/p3_repo.parquet")):
        p3 = pq.read_table(p3_path)
        p4 = pq.read_table(p3_path.with_name("p4_structure.parquet"))
        assert kept.document_order_indices(p3, {p3.column("source")[0].as_py(): 0}) is None
        assert p4.column("doc_key").equals(p3.column("doc_key"))
        pieces = p3.filter(pc.is_valid(p3.column("paths")))
        idx = pieces.column("chunk_index").to_pylist()
        assert sorted(idx) == list(range(len(idx)))  # every piece once
        checked += 1
    assert checked >= 2


def test_the_file_schema_gate_reads_batches_and_catches_keys_across_them(tmp_path):
    """The per-revision family documents are validated from the committed file 64 at a
    time; a key repeated in another batch and a document without its BOS fail."""
    from megacpp_checks.schemas import documents as s_documents
    from megacpp_core import family_documents
    from megacpp_core import tokenizer as tk

    p3 = rd.revision_documents("r", FILES, _encode, bos_id=tk.BOS_ID, file_sep_id=7, budget=120)
    t = family_documents.repo_family_table(p3.table, {p: "permissive" for p in FILES}, "rev")
    reps = [t.set_column(0, "doc_key", pc.binary_join_element_wise(t.column("doc_key"), pa.scalar(f"-{i}"), ""))
            .set_column(1, "file_key", pc.binary_join_element_wise(t.column("doc_key"), pa.scalar(f"-{i}"), ""))
            for i in range(-(-70 // t.num_rows))]
    good = pa.concat_tables(reps)
    assert good.num_rows > s_documents.FILE_BATCH_DOCS
    check = s_documents.family_file_validator(65_536)

    def verdict(table):
        path = tmp_path / "f.parquet"
        pq.write_table(table, path)
        return check(pq.ParquetFile(path))

    assert verdict(good)[0], verdict(good)
    twice = pa.concat_tables([good, good.slice(0, 1)])
    ok, detail = verdict(twice)
    assert not ok and "twice" in detail
    ids = good.column("input_ids").to_pylist()
    ids[-1] = ids[-1][1:]
    bad = good.set_column(good.schema.get_field_index("input_ids"), "input_ids", pa.array(ids, pa.list_(pa.uint32())))
    assert not verdict(bad)[0]


def test_read_rows_decodes_only_the_row_groups_that_hold_them(tmp_path):
    """The packer reads a group's documents by row number: the right rows, in file order,
    whatever row groups they sit in (and an input without a parquet file gives the same)."""
    from megacpp_core.pack_stream import read_rows

    rows = _rows(50)
    path = tmp_path / "d.parquet"
    write_parquet_to(rows, path, row_group_size=8)

    class Ref:
        def parquet_file(self):
            return pq.ParquetFile(path)

    class Plain:
        def read(self, columns=None):
            return pq.read_table(path, columns=columns)

    for want in ([0], [49], [7, 8], [3, 17, 18, 40, 41, 42], list(range(50)), [41, 3, 17]):
        got = read_rows(Ref(), np.asarray(want, np.int64), ["row", "input_ids"])
        assert got.column("row").to_pylist() == sorted(want)
        assert got.column("input_ids").equals(rows.column("input_ids").take(pa.array(sorted(want))))
        assert read_rows(Plain(), np.asarray(want, np.int64), ["row", "input_ids"]).equals(got)
