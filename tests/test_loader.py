"""The tolerant loader: derived views, strict/tolerant columns, and the boundary proofs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from megacpp_core import loader, pack
from megacpp_core.tables import sha256_file

BOS, PAD, V, L = 2, 0, 1000, 96


def _shards(tmp_path, lengths=(30, 17, 40, 9, 60, 33, 5, 70, 12), planes=True, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for i, n in enumerate(lengths):
        ids = rng.integers(64, V, size=n).astype(np.uint32)
        ids[0] = BOS
        extras = {"structure_ids": rng.integers(0, 9, size=n), "ast_depth": rng.integers(0, 64, size=n)} if planes else {}
        docs.append(pack.PackInput(ids, f"s/f{i}.c#0", "s", "r", f"f{i}.c", 0, extras=extras))
    rows = pack.build_rows(docs, L, BOS, PAD, optional=("structure_ids", "ast_depth") if planes else ())
    pack.write_shards(rows, tmp_path, row_length=L, vocab_size=V, tokenizer_sha256="ab" * 32)
    return rows


def _rewrite(tmp_path, fn):
    """Apply ``fn`` to the train shard and re-seal the sentinel (a producer bug, not corruption)."""
    import json

    f = tmp_path / "train-00000.parquet"
    pq.write_table(fn(pq.read_table(f)), f)
    s = json.loads((tmp_path / pack.SUCCESS).read_text())
    s["files"][0]["sha256"] = sha256_file(f)
    (tmp_path / pack.SUCCESS).write_text(json.dumps(s))


def test_yields_contract_views(tmp_path):
    rows = _shards(tmp_path)
    ds = loader.PackedRowsDataset(tmp_path, planes=["structure_ids"])
    assert len(ds) == rows.num_rows - 1
    for i in range(len(ds)):
        item, row = ds[i], rows.slice(i, 1).to_pylist()[0]
        v = row["valid_token_count"]
        ids = item["input_ids"].numpy()
        assert ids.tolist() == row["input_ids"] and item["doc_ids"].tolist() == row["doc_ids"]
        starts = np.flatnonzero(ids[:v] == BOS)
        cu = item["cu_seqlens"].tolist()
        assert item["cu_seqlens"].dtype == torch.int32 and cu == starts.tolist() + ([v] if v < L else []) + [L]
        for k in range(len(cu) - 1):
            assert item["position_ids"][cu[k]:cu[k + 1]].tolist() == list(range(cu[k + 1] - cu[k]))
            assert (item["segment_ids"][cu[k]:cu[k + 1]] == k).all()
        assert item["structure_ids"].tolist() == row["structure_ids"]
        assert "ast_depth" not in item
    batch = loader.collate([ds[0], ds[1]])
    assert batch["input_ids"].shape == (2, L)
    assert batch["cu_seqlens"].tolist() == ds[0]["cu_seqlens"][:-1].tolist() + (ds[1]["cu_seqlens"] + L).tolist()


def test_optional_columns_default_when_absent_or_malformed_and_strict_when_enabled(tmp_path):
    _shards(tmp_path, planes=False)
    ds = loader.PackedRowsDataset(tmp_path, planes=["structure_ids", "chunk_boundaries"])
    assert ds.defaulted == {"structure_ids": len(ds), "chunk_boundaries": len(ds)}
    assert not ds[0]["structure_ids"].any() and ds[0]["chunk_boundaries"] == []
    with pytest.raises(loader.LoaderError, match="structure_ids is absent; a feature needing it is enabled"):
        loader.PackedRowsDataset(tmp_path, features=["structure_embedding"])


def test_malformed_plane_row_defaults_to_zeros_deterministically(tmp_path):
    _shards(tmp_path)

    def break_row(t):
        vals = t.column("structure_ids").to_pylist()
        vals[1] = [200] * L  # above StructureCategory's range 0..8
        return t.set_column(t.schema.get_field_index("structure_ids"), "structure_ids", pa.array(vals, pa.list_(pa.uint8())))

    _rewrite(tmp_path, break_row)
    ds = loader.PackedRowsDataset(tmp_path, planes=["structure_ids", "ast_depth"])
    assert ds.defaulted["structure_ids"] == 1 and ds.defaulted["ast_depth"] == 0
    assert not ds[1]["structure_ids"].any() and ds[0]["structure_ids"].any()
    with pytest.raises(loader.LoaderError, match="structure_ids is malformed in row 1"):
        loader.PackedRowsDataset(tmp_path, features=["structure_embedding"])


def test_required_columns_are_strict(tmp_path):
    _shards(tmp_path)
    _rewrite(tmp_path, lambda t: t.drop_columns(["loss_mask"]))
    with pytest.raises(loader.LoaderError, match=r"train-00000.parquet: required columns missing: \['loss_mask'\]"):
        loader.PackedRowsDataset(tmp_path)
    _shards(tmp_path)
    _rewrite(tmp_path, _set("input_ids", 0, V + 1, pa.uint32(), pos=1))
    for full in (False, True):  # the same token-level check either way
        with pytest.raises(loader.LoaderError, match="row 0: token id ≥ vocab size"):
            loader.PackedRowsDataset(tmp_path, full_contract=full)
    with pytest.raises(pack.TokenizerMismatchError):
        loader.PackedRowsDataset(tmp_path, tokenizer_sha256="cd" * 32)


def _set(column, row, value, typ, pos=None):
    """An edit of a shard table: ``column[row] = value``, or ``column[row][pos]`` for a list column."""
    def edit(t):
        vals = t.column(column).to_pylist()
        if pos is None:
            vals[row] = value
        else:
            vals[row][pos] = value
        return t.set_column(t.schema.get_field_index(column), column,
                            pa.array(vals, typ if pos is None else pa.list_(typ)))
    return edit


def _refused(tmp_path, edit, message, **kwargs):
    """Fresh shards with one edit must make the loader refuse them with ``message``."""
    _shards(tmp_path)
    _rewrite(tmp_path, edit)
    with pytest.raises(loader.LoaderError, match=message):
        loader.PackedRowsDataset(tmp_path, **kwargs)


def test_strict_checks_and_the_full_contract(tmp_path):
    _refused(tmp_path, _set("loss_mask", 1, 2, pa.uint8(), pos=3), "row 1: loss_mask holds a value other than 0/1")
    _refused(tmp_path, _set("input_ids", 0, 7, pa.uint32(), pos=0), "row 0: first token is not BOS")
    # doc_ids are never yielded (derived from input_ids): a corrupt stored column is caught
    # only by the full contract, and the default loader still yields the right doc_ids
    _shards(tmp_path)
    good = loader.PackedRowsDataset(tmp_path)[0]["doc_ids"].clone()
    _rewrite(tmp_path, _set("doc_ids", 0, 9, pa.uint32(), pos=1))
    with pytest.raises(loader.LoaderError, match="row 0: doc_ids != cumsum"):
        loader.PackedRowsDataset(tmp_path, full_contract=True)
    assert torch.equal(loader.PackedRowsDataset(tmp_path)[0]["doc_ids"], good)


def test_document_masked_attention_equals_attention_per_document(tmp_path):
    _shards(tmp_path)
    ds = loader.PackedRowsDataset(tmp_path)
    torch.manual_seed(0)
    checked = 0
    for i in range(len(ds)):
        item = ds[i]
        if int(item["doc_ids"].max()) < 2:
            continue
        H, D = 2, 16
        q, k, v = (torch.randn(1, H, L, D, dtype=torch.float32) for _ in range(3))
        mask = loader.document_attention_mask(item["segment_ids"])
        packed = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        cu = item["cu_seqlens"].tolist()
        for s, e in zip(cu[:-1], cu[1:]):
            alone = torch.nn.functional.scaled_dot_product_attention(q[..., s:e, :], k[..., s:e, :], v[..., s:e, :], is_causal=True)
            assert (packed[..., s:e, :] - alone).abs().max().item() < 1e-5
        # a causal depthwise conv with resets at BOS equals the conv over each document alone
        C, K = 4, 5
        x, w = torch.randn(1, C, L), torch.randn(C, K)
        y = loader.reset_causal_conv(x, w, item["segment_ids"][None])
        for s, e in zip(cu[:-1], cu[1:]):
            ref = torch.nn.functional.conv1d(torch.nn.functional.pad(x[..., s:e], (K - 1, 0)), w[:, None, :], groups=C)
            assert (y[..., s:e] - ref).abs().max().item() < 1e-5
        checked += 1
    assert checked >= 2


def test_loader_reads_the_tiny_snapshot(tiny_run):
    from megacpp_core.layout import SnapshotLayout

    root, _ = tiny_run
    packed = SnapshotLayout(root, "tiny").stage_dir("packed")
    ds = loader.PackedRowsDataset(packed)
    sentinel = pack.read_success(packed)
    assert len(ds) == sentinel["rows"] - sentinel["validation_rows"]
    item = ds[0]
    assert int(item["cu_seqlens"][-1]) == sentinel["row_length"]
    assert int((item["position_ids"] == 0).sum()) == len(item["cu_seqlens"]) - 1


def test_null_valid_count_and_loss_on_padding_are_refused(tmp_path):
    _refused(tmp_path, _set("valid_token_count", 0, None, pa.int32()), "valid_token_count has 1 null")
    _refused(tmp_path, _set("loss_mask", 0, 1, pa.uint8(), pos=L - 1),  # loss on the last (PAD) position
             "loss_mask is 1 where the target is not a real in-document token")
    _refused(tmp_path, _set("target_ids", 0, 7, pa.uint32(), pos=2), "target_ids is not the next in-document token")


def test_platform_ids_load_without_the_full_contract(tmp_path):
    docs = []
    for i, n in enumerate((20, 30, 11)):
        ids = np.full(n, 70 + i, dtype=np.uint32)
        ids[0] = BOS
        docs.append(pack.PackInput(ids, f"s/f{i}.c#0", "s", "r", f"f{i}.c", 0, extras={"platform_ids": [1, 2 + i]}))
    rows = pack.build_rows(docs, L, BOS, PAD, optional=("platform_ids",))
    pack.write_shards(rows, tmp_path, row_length=L, vocab_size=V, tokenizer_sha256="ab" * 32, validation_fraction=0.0)
    ds = loader.PackedRowsDataset(tmp_path, features=["platform_conditioning"])
    got = sorted(tuple(p) for i in range(len(ds)) for p in ds[i]["platform_ids"])
    assert got == [(1, 2), (1, 3), (1, 4)]


def test_document_attention_mask_of_a_block_of_query_rows_equals_those_rows_of_the_whole_mask():
    import torch
    seg = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3], dtype=torch.int32)
    whole = loader.document_attention_mask(seg)
    assert whole.shape == (9, 9)
    for lo, hi in ((0, 9), (2, 6), (5, 9), (8, 9)):
        assert torch.equal(loader.document_attention_mask(seg, slice(lo, hi)), whole[lo:hi])
    assert not whole[3, 2] and whole[4, 3] and not whole[3, 4]  # no key of an earlier segment, none ahead
    with pytest.raises(ValueError):
        loader.document_attention_mask(seg, slice(0, 9, 2))
