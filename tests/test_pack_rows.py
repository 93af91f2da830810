"""Stage 9 in full: O(N log L) best fit, optional columns through packing, the pandera row
gate on hostile rows, the `_SUCCESS` protocol under a killed writer, tokenizer lineage."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megacpp_checks.packed import verify_packed_dir
from megacpp_checks.schemas.packed import validate_packed
from megacpp_core import pack

BOS, PAD, V = 2, 0, 1000


def naive_best_fit(lengths, L):
    """Quadratic reference: scan every open row for the tightest fit (lowest index on ties)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows, room = [], []
    for i in order:
        best = min((r for r in range(len(rows)) if room[r] >= lengths[i]), key=lambda r: (room[r], r), default=None)
        if best is None:
            rows.append([i]); room.append(L - lengths[i])
        else:
            rows[best].append(i); room[best] -= lengths[i]
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_segment_tree_bfd_equals_reference_best_fit(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.choice([16, 64, 1000]))
    lengths = [int(x) for x in rng.integers(1, L + 1, size=300)]
    assert pack.best_fit_decreasing(lengths, L) == naive_best_fit(lengths, L)


def test_no_truncation_error_names_the_document():
    with pytest.raises(pack.PackingError, match=r"src/huge\.cc#0: 4097 tokens .* 4096.*never truncated"):
        pack.best_fit_decreasing([10, 4097], 4096, ["a.c#0", "src/huge.cc#0"])


def _doc(i, n, rng, planes=True):
    ids = rng.integers(64, V, size=n).astype(np.uint32)
    ids[0] = BOS
    extras = {}
    if planes:
        extras = {p: rng.integers(0, 9, size=n) for p in pack.PLANES}
        half = max(1, n // 2)
        extras["chunk_boundaries"] = [{"start": 0, "end": half, "kind": "PREAMBLE", "name": "", "dep_level": 0},
                                      {"start": half, "end": n, "kind": "FUNC_BODY", "name": f"f{i}", "dep_level": 1}] if n > 1 else \
                                     [{"start": 0, "end": 1, "kind": "OTHER", "name": "", "dep_level": 0}]
        k = len(extras["chunk_boundaries"])
        extras["call_edges"] = [{"from": k - 1, "to": 0}]
        extras["type_edges"] = []
        extras["platform_ids"] = [i % 7, 100 + i]
    return pack.PackInput(ids, f"s/f{i}.cc#0", "s", "rev", f"f{i}.cc", 0, extras=extras)


def test_optional_columns_travel_with_their_document():
    rng = np.random.default_rng(3)
    docs = [_doc(i, int(n), rng) for i, n in enumerate(rng.integers(1, 120, size=40))]
    rows = pack.build_rows(docs, 128, BOS, PAD, optional=pack.OPTIONAL_COLUMNS)
    assert rows.schema == pack.row_schema(pack.OPTIONAL_COLUMNS)
    pack.check_rows(rows, 128, V, BOS, PAD)
    assert validate_packed(rows, 128, V, BOS, PAD)[0]
    by_key = {d.doc_key: d for d in docs}
    for row in rows.to_pylist():
        dids = np.asarray(row["doc_ids"])
        chunks = iter(row["chunk_boundaries"])
        chunk_base = 0
        for k, key in enumerate(row["doc_keys"], 1):
            d, where = by_key[key], np.flatnonzero(dids == k)
            for p in pack.PLANES:
                assert np.array_equal(np.asarray(row[p])[where], d.extras[p]), p
            for c in d.extras["chunk_boundaries"]:
                got = next(chunks)
                assert (got["start"], got["end"]) == (c["start"] + where[0], c["end"] + where[0])
                assert got["name"] == c["name"]
            assert row["platform_ids"][k - 1] == d.extras["platform_ids"]
            assert {"from": len(d.extras["chunk_boundaries"]) - 1 + chunk_base, "to": chunk_base} in row["call_edges"]
            chunk_base += len(d.extras["chunk_boundaries"])
        for p in pack.PLANES:
            assert not any(row[p][row["valid_token_count"]:])


def test_optional_columns_absent_when_inputs_lack_them():
    rng = np.random.default_rng(0)
    rows = pack.build_rows([_doc(i, 30, rng, planes=False) for i in range(5)], 64, BOS, PAD)
    assert rows.schema == pack.ROW_SCHEMA


def test_misaligned_plane_is_refused_naming_the_document():
    rng = np.random.default_rng(0)
    d = _doc(0, 20, rng)
    d.extras["ast_depth"] = d.extras["ast_depth"][:-1]
    with pytest.raises(pack.PackingError, match=r"s/f0\.cc#0: plane ast_depth has 19 entries for 20 tokens"):
        pack.build_rows([d], 64, BOS, PAD, optional=pack.OPTIONAL_COLUMNS)


def _rows_with_everything():
    rng = np.random.default_rng(1)
    return pack.build_rows([_doc(i, int(n), rng) for i, n in enumerate(rng.integers(2, 60, size=30))], 64, BOS, PAD,
                           optional=pack.OPTIONAL_COLUMNS)


def _set(table, column, row, value):
    vals = table.column(column).to_pylist()
    vals[row] = value(vals[row])
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i), pa.array(vals, type=table.schema.field(i).type))


def _shift_chunk(cs):
    return [{**c, "start": 0, "end": 64} if j == 0 else c for j, c in enumerate(cs)]


@pytest.mark.parametrize("column,value,needle", [
    ("input_ids", lambda x: x[:-1], "input_ids_len"),
    ("input_ids", lambda x: [V + 5] + x[1:], "max_id"),
    ("input_ids", lambda x: x[:-1] + [77], "non_pad_tail"),
    ("doc_ids", lambda x: [9] + x[1:], "doc_id_errors"),
    ("target_ids", lambda x: [x[0] + 1] + x[1:], "target_errors"),
    ("loss_mask", lambda x: x[:-1] + [1], "loss_errors"),
    ("num_docs", lambda x: x + 1, "num_docs == count(BOS)"),
    ("structure_ids", lambda x: x[:-1] + [3], "plane_errors"),
    ("chunk_boundaries", _shift_chunk, "span_errors"),
    ("call_edges", lambda es: es + [{"from": 0, "to": 99}], "span_errors"),
    ("platform_ids", lambda x: x[:-1], "len(platform_ids) == num_docs"),
    ("input_ids", lambda x: [x[0], 2**32 - 1] + x[2:], "max_id"),  # uint32's largest id, kept as it is
    ("input_ids", lambda x: [x[0], None] + x[2:], "null_values"),  # a null id inside a row
    ("structure_ids", lambda x: [None] + x[1:], "null_values"),
    ("loss_mask", lambda x: [255] + x[1:], "loss_errors"),
])
def test_pandera_gate_names_the_broken_row_and_rule(column, value, needle):
    rows = _rows_with_everything()
    assert validate_packed(rows, 64, V, BOS, PAD)[0]
    row = 2 if column != "input_ids" or needle != "non_pad_tail" else \
        next(i for i, v in enumerate(rows.column("valid_token_count").to_pylist()) if v < 64)
    bad = _set(rows, column, row, value)
    ok, detail = validate_packed(bad, 64, V, BOS, PAD)
    assert not ok and needle in detail and f"[{row}]" in detail, detail
    with pytest.raises(pack.RowContractError, match=f"row {row}"):
        pack.check_rows(bad, 64, V, BOS, PAD)


WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from megacpp_core import pack, tables
    out, die = sys.argv[1], sys.argv[2] == "die"
    rng = np.random.default_rng(0)
    docs = []
    for i in range(400):
        ids = rng.integers(64, 1000, size=int(rng.integers(2, 60))).astype(np.uint32); ids[0] = 2
        docs.append(pack.PackInput(ids, f"s/f{i}.c#0", "s", "r", f"f{i}.c", 0))
    rows = pack.build_rows(docs, 64, 2, 0)
    if die:
        real = tables.write_parquet
        def killed_after_first(table, path, **kw):
            if any(p.suffix == ".parquet" for p in path.parent.iterdir()):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(table, path, **kw)
        pack.write_parquet = killed_after_first
    pack.write_shards(rows, out, row_length=64, vocab_size=1000, tokenizer_sha256="ab" * 32, max_docs_per_shard=100)
""")


def test_killed_writer_leaves_a_directory_consumers_refuse_then_rerun_completes(tmp_path):
    from megacpp_core.loader import PackedRowsDataset

    out = tmp_path / "packed"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", WRITER, str(out), "die"], env=env)
    assert p.returncode == -signal.SIGKILL
    assert list(out.glob("*.parquet")) and not (out / pack.SUCCESS).exists()
    with pytest.raises(pack.IncompleteShardsError, match="no _SUCCESS"):
        pack.read_success(out)
    with pytest.raises(pack.IncompleteShardsError):
        PackedRowsDataset(out)
    assert not verify_packed_dir(out, out=lambda m: None).ok
    subprocess.run([sys.executable, "-c", WRITER, str(out), "ok"], env=env, check=True)
    sentinel = pack.read_success(out)
    assert len(sentinel["files"]) > 2 and all(f["docs"] <= 100 for f in sentinel["files"])
    assert verify_packed_dir(out, out=lambda m: None).ok
    assert len(PackedRowsDataset(out)) == sentinel["rows"] - sentinel["validation_rows"]


def test_shards_split_row_groups_and_sentinel_records_lineage(tmp_path):
    rows = _rows_with_everything()
    s = pack.write_shards(rows, tmp_path, row_length=64, vocab_size=V, tokenizer_sha256="cd" * 32,
                          max_docs_per_shard=10, row_group_size=4)
    assert s["validation_rows"] == math.ceil(rows.num_rows * 0.01)
    assert s["tokenizer_sha256"] == "cd" * 32 and s["vocab_size"] == V and s["optional_columns"] == list(pack.OPTIONAL_COLUMNS)
    for f in s["files"]:
        md = pq.ParquetFile(tmp_path / f["file"]).metadata
        assert f["docs"] <= 10 or f["rows"] == 1
        assert all(md.row_group(g).num_rows <= 4 for g in range(md.num_row_groups))
    last = pq.read_table(tmp_path / s["files"][-1]["file"]).column("pack_id").to_pylist()
    assert s["files"][-1]["split"] == "validation" and last[-1] == rows.num_rows - 1
    with pytest.raises(pack.TokenizerMismatchError, match="tokenizer sha256"):
        pack.read_success(tmp_path, tokenizer_sha256="ef" * 32)
    with pytest.raises(pack.TokenizerMismatchError, match="vocabulary size"):
        pack.read_success(tmp_path, vocab_size=V * 2)
    report = verify_packed_dir(tmp_path, out=lambda m: None, tokenizer_sha256="ef" * 32)
    assert not report.ok and "tokenizer sha256" in report.failures[0]


def test_pack_and_format_refuse_a_tokenizer_mismatch(tiny_run, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    from megacpp_core import stages
    from megacpp_core.layout import SnapshotLayout
    from megacpp_core.manifest import load_manifest

    root, _ = tiny_run
    src = SnapshotLayout(root, "tiny")
    copy = SnapshotLayout(tmp_path, "tiny")
    shutil.copytree(src.root, copy.root)  # the snapshot: its tokenized shards, chunk drops, tokenizer, packed rows
    manifest = load_manifest("tiny")
    sentinel = json.loads((copy.stage_dir("packed") / pack.SUCCESS).read_text())
    sentinel["tokenizer_sha256"] = "1" * 64
    (copy.stage_dir("packed") / pack.SUCCESS).write_text(json.dumps(sentinel))
    with pytest.raises(pack.TokenizerMismatchError, match="1{64}"):
        stages.run("format", copy.data_root, manifest)
    from megacpp_assets.cli import main

    assert main(["verify", str(copy.stage_dir("packed"))]) == 1
    docs = copy.shard("lz4-4.4.5") / "tokenized.parquet"
    table = pq.read_table(docs)  # documents tokenized with another tokenizer (their lineage key says so)
    pq.write_table(table.replace_schema_metadata({b"megacpp.tokenizer_sha256": b"0" * 64}), docs)
    with pytest.raises(pack.TokenizerMismatchError, match="0{64}.*snapshot tokenizer"):
        stages.run("pack", copy.data_root, manifest)
    assert not (copy.stage_dir("packed") / pack.SUCCESS).exists()  # the refused run left no sentinel behind
