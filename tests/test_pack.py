"""Best-fit-decreasing packing and the SPEC §6 row contract, including broken rows."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from megacpp_core import pack

BOS, PAD, V = 2, 0, 1000


def _docs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = rng.integers(64, V, size=n, dtype=np.uint32)
        ids[0] = BOS
        out.append(pack.PackInput(ids, f"s/f{i}.c#0", "s", "rev", f"f{i}.c", 0))
    return out


def test_bfd_places_every_document_once_and_respects_capacity():
    lengths = [5, 9, 3, 7, 2, 8, 1, 4, 6, 10]
    rows = pack.best_fit_decreasing(lengths, 10)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= 10 for r in rows)
    assert len(rows) == math.ceil(sum(lengths) / 10)  # this set packs perfectly


def test_bfd_refuses_oversized_document_naming_it():
    with pytest.raises(pack.PackingError, match="big.c"):
        pack.best_fit_decreasing([3, 11], 10, ["a.c", "big.c"])


def test_rows_satisfy_contract_and_are_deterministic():
    docs = _docs([100, 50, 30, 200, 64, 1, 17, 255])
    t1 = pack.build_rows(docs, 256, BOS, PAD)
    t2 = pack.build_rows(docs, 256, BOS, PAD)
    assert t1.equals(t2)
    s = pack.check_rows(t1, 256, V, BOS, PAD)
    assert s["docs"] == len(docs) and s["tokens"] == sum(len(d.ids) for d in docs)
    row = t1.to_pylist()[0]
    ids = np.array(row["input_ids"])
    v = row["valid_token_count"]
    assert (ids[v:] == PAD).all()
    assert row["num_docs"] == (ids[:v] == BOS).sum()
    assert np.array_equal(row["doc_ids"][:v], np.cumsum(ids[:v] == BOS))
    # target is the next token inside the same document; loss only there
    tgt, msk, did = np.array(row["target_ids"]), np.array(row["loss_mask"]), np.array(row["doc_ids"])
    for i in range(v - 1):
        same = did[i + 1] == did[i]
        assert msk[i] == same and (tgt[i] == (ids[i + 1] if same else PAD))


def _mutate(table: pa.Table, column: str, fn) -> pa.Table:
    rows = table.to_pylist()
    fn(rows[0])
    return pa.Table.from_pylist(rows, schema=table.schema)


@pytest.mark.parametrize("column,fn,rule", [
    ("doc_ids", lambda r: r["doc_ids"].__setitem__(5, 7), "doc_ids"),
    ("num_docs", lambda r: r.__setitem__("num_docs", r["num_docs"] + 1), "num_docs"),
    ("input_ids", lambda r: r["input_ids"].__setitem__(0, 70), "BOS"),
    ("input_ids", lambda r: r["input_ids"].__setitem__(3, V + 5), "vocab"),
    ("loss_mask", lambda r: r["loss_mask"].__setitem__(r["valid_token_count"] - 1, 1), "loss_mask"),
    ("target_ids", lambda r: r["target_ids"].__setitem__(0, 99), "target_ids"),
    ("input_ids", lambda r: r["input_ids"].__setitem__(255, 77), "PAD"),
])
def test_contract_violations_are_caught(column, fn, rule):
    t = pack.build_rows(_docs([100, 50, 30]), 256, BOS, PAD)
    bad = _mutate(t, column, fn)
    with pytest.raises(pack.RowContractError, match=rule):
        pack.check_rows(bad, 256, V, BOS, PAD)


def test_shards_sentinel_written_last_and_readers_refuse_without_it(tmp_path):
    t = pack.build_rows(_docs([60] * 300), 128, BOS, PAD)
    s = pack.write_shards(t, tmp_path, row_length=128, vocab_size=V, tokenizer_sha256="x" * 64, max_docs_per_shard=100)
    assert s["validation_rows"] == math.ceil(t.num_rows * 0.01)
    assert all(f["docs"] <= 100 for f in s["files"])
    assert sum(f["rows"] for f in s["files"]) == t.num_rows
    from megacpp_checks.packed import verify_packed_dir
    assert verify_packed_dir(tmp_path, out=lambda m: None).ok
    (tmp_path / pack.SUCCESS).unlink()
    with pytest.raises(pack.IncompleteShardsError):
        pack.read_success(tmp_path)
    assert not verify_packed_dir(tmp_path, out=lambda m: None).ok


def test_verify_reads_row_groups_and_finds_a_bad_row_and_a_repeated_pack_id(tmp_path, monkeypatch):
    """The gate checks a file row group by row group (memory: one row group): a broken row
    in a later row group is named with its row group, and a ``pack_id`` repeated across
    files (each file valid alone) fails the directory."""
    import json

    import pyarrow.parquet as pq

    from megacpp_checks.packed import verify_packed_dir
    from megacpp_core.tables import sha256_file

    t = pack.build_rows(_docs([60] * 300), 128, BOS, PAD)
    good = tmp_path / "good"
    s = pack.write_shards(t, good, row_length=128, vocab_size=V, tokenizer_sha256="x" * 64, max_docs_per_shard=100,
                          row_group_size=16)
    assert all(pq.ParquetFile(good / f["file"]).num_row_groups > 1 for f in s["files"][:1])
    assert verify_packed_dir(good, out=lambda m: None, tokenizer_sha256="x" * 64, vocab_size=V).figures["rows"] == t.num_rows

    bad = tmp_path / "bad"
    broken = _mutate(t.slice(23), "doc_ids", lambda r: r["doc_ids"].__setitem__(5, 7))  # row 23: row 7 of row group 1
    pack.write_shards(pa.concat_tables([t.slice(0, 23), broken]), bad, row_length=128, vocab_size=V,
                      tokenizer_sha256="x" * 64, max_docs_per_shard=10_000, row_group_size=16)
    r = verify_packed_dir(bad, out=lambda m: None, tokenizer_sha256="x" * 64, vocab_size=V)
    assert not r.ok and "(row group 1)" in r.failures[0]

    # a row group is checked CHECK_ROWS rows at a time: every row still counted, the bad
    # row (row 7 of row group 1, in its second slice) named with its slice
    import megacpp_checks.packed as packed_gate

    monkeypatch.setattr(packed_gate, "CHECK_ROWS", 5)
    assert verify_packed_dir(good, out=lambda m: None, tokenizer_sha256="x" * 64, vocab_size=V).figures["rows"] == t.num_rows
    r = verify_packed_dir(bad, out=lambda m: None, tokenizer_sha256="x" * 64, vocab_size=V)
    assert not r.ok and "(row group 1) rows 5..9" in r.failures[0], r.failures
    monkeypatch.undo()
    # longer rows are checked fewer at a time: the same tokens per batch (rows of 128
    # tokens here: 3 at a time under a 400-token cap, the bad row in rows 6..8)
    from megacpp_core import pack_stream

    monkeypatch.setattr(pack_stream, "CHECK_TOKENS", 400)
    assert [pack_stream.check_batch_rows(L) for L in (128, 400, 10**6)] == [3, 1, 1]
    r = verify_packed_dir(bad, out=lambda m: None, tokenizer_sha256="x" * 64, vocab_size=V)
    assert not r.ok and "(row group 1) rows 6..8" in r.failures[0], r.failures
    monkeypatch.undo()
    assert [pack_stream.check_batch_rows(L) for L in (4096, 8192, 16384, 65536)] == [128, 128, 64, 16]

    twice = tmp_path / "twice"
    pack.write_shards(t, twice, row_length=128, vocab_size=V, tokenizer_sha256="x" * 64, max_docs_per_shard=100)
    sentinel = json.loads((twice / pack.SUCCESS).read_text())
    first, second = sentinel["files"][0], sentinel["files"][1]
    # the second file rewritten with the first file's pack_ids (valid on its own)
    t2 = pq.read_table(twice / second["file"])
    ids = pq.read_table(twice / first["file"]).column("pack_id").to_numpy()[: t2.num_rows]
    t2 = t2.set_column(t2.schema.get_field_index("pack_id"), "pack_id", pa.array(ids))
    pq.write_table(t2, twice / second["file"])
    second["sha256"] = sha256_file(twice / second["file"])
    (twice / pack.SUCCESS).write_text(json.dumps(sentinel))
    r = verify_packed_dir(twice, out=lambda m: None, tokenizer_sha256="x" * 64, vocab_size=V)
    assert not r.ok and "pack_id repeated" in r.failures[0]
