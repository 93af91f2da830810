"""End to end on real sdists: the ``tiny`` snapshot through Dagster, verify, megatron-core readback."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from dagster import AssetKey

from megacpp_assets.cli import main
from megacpp_core.stages import STAGES
from megacpp_core import pack
from megacpp_core import tokenizer as tk
from megacpp_core.layout import SnapshotLayout

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def layout(tiny_run):
    root, _ = tiny_run
    return SnapshotLayout(root, "tiny")


def _rows(layout):
    sentinel = pack.read_success(layout.stage_dir("packed"))
    for f in sentinel["files"]:
        yield from pq.read_table(layout.stage_dir("packed") / f["file"]).to_pylist()


def test_dagster_recorded_every_asset_and_check(tiny_run):
    root, instance = tiny_run
    for key in ["source_files", "quality_files", "license_files", "scrubbed_files", "chunked_documents",
                "tokenized_documents"]:
        mats = instance.fetch_materializations(AssetKey(key), limit=10).records
        parts = {m.event_log_entry.dagster_event.partition for m in mats}
        revisions = {"tiny/pybind11-3.1.0", "tiny/lz4-4.4.5", "tiny/xxhash-4.1.0"}
        assert parts == (revisions if key == "source_files" else {f"{r}|000" for r in revisions}), key
    for key in ["dedup_decisions", "tokenizer", "chunk_dedup", "packed_rows", "megatron_dataset", "dataset_card"]:
        mats = instance.fetch_materializations(AssetKey(key), limit=1).records
        assert mats and mats[0].event_log_entry.dagster_event.partition == "tiny", key
    def metadata(asset):
        return instance.fetch_materializations(AssetKey(asset), limit=1).records[0] \
            .event_log_entry.dagster_event.event_specific_data.materialization.metadata

    assert "Dataset card" in metadata("dataset_card")["card"].value and metadata("megatron_dataset")["verify_ok"].value is True
    from dagster import AssetCheckKey
    for asset, names in ((s.asset, s.check_names) for s in STAGES):
        for name in names:
            rec = instance.event_log_storage.get_latest_asset_check_execution_by_key([AssetCheckKey(AssetKey(asset), name)])
            ex = rec[AssetCheckKey(AssetKey(asset), name)]
            assert ex.evaluation.passed, (asset, name)


def test_verify_exits_zero_on_output(layout, capsys):
    prefix = layout.stage_dir("megatron") / "tiny_text_document"
    assert main(["verify", str(prefix)]) == 0
    assert main(["verify", str(layout.stage_dir("packed"))]) == 0
    out = capsys.readouterr().out
    assert "first 64 tokens" in out.lower() or "64" in out


def test_megatron_readback_matches_parquet_rows(layout):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = layout.stage_dir("megatron") / "tiny_text_document"
    ds = IndexedDataset(str(prefix))
    docs = pq.read_table(layout.stage_dir("megatron") / "tiny_text_document.documents.parquet").column("doc_key").to_pylist()
    assert len(ds) == len(docs) > 0
    megatron_by_key = {k: np.asarray(ds[i]) for i, k in enumerate(docs)}
    assert ds.index.dtype == np.int32
    seen = 0
    for row in _rows(layout):
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        valid = row["valid_token_count"]
        bos = ids[:valid] == tk.BOS_ID
        assert row["num_docs"] == int(bos.sum())
        assert np.array_equal(np.asarray(row["doc_ids"][:valid]), np.cumsum(bos))
        assert not any(row["doc_ids"][valid:])
        doc_ids = np.asarray(row["doc_ids"])
        for k, key in enumerate(row["doc_keys"], 1):
            assert np.array_equal(ids[doc_ids == k], megatron_by_key[key]), key
            seen += 1
    assert seen == len(docs)


def test_tokenizer_layout_and_card(layout):
    info = json.loads((layout.stage_dir("tokenizer") / "tokenizer_manifest.json").read_text())
    assert info["vocab_size"] == 131072
    tok = tk.load_tokenizer(layout.stage_dir("tokenizer") / "tokenizer.json", info["tokenizer_sha256"])
    assert tok.get_vocab_size(with_added_tokens=True) == 131072
    for i, name in enumerate(["<PAD>", "<UNK>", "<BOS>", "<EOS>"]):
        assert tok.token_to_id(name) == i
    assert tok.token_to_id("<FIM_PREFIX>") < 64
    card = layout.card.read_text()
    for needle in ("quality", "license", "exact duplicates removed", "Rows", "padding fraction", "Wall time"):
        assert needle in card


def test_every_stage_did_real_work(layout):
    q = layout.read_figures("quality", "lz4-4.4.5")
    assert q["files_out"] > 5 and q["rejected"]["extension"] > 0
    lic = layout.read_figures("license", "lz4-4.4.5")
    assert lic["classes"].get("permissive", 0) > 0
    d = layout.read_figures("dedup")
    assert d["files_in"] == d["files_out"] + d["exact_removed"] + d["near_removed"]
    c = layout.read_figures("chunk")
    assert c["documents"] >= c["files"] and c["max_document_tokens"] <= 8191
    p = layout.read_figures("pack")
    assert p["rows"] >= p["rows_lower_bound"] and 0 <= p["padding_fraction"] < 1


def test_inspect_prints_a_decoded_row(layout, capsys):
    assert main(["inspect", str(layout.stage_dir("packed")), "--row", "0"]) == 0
    out = capsys.readouterr().out
    assert "row 0" in out and "--- document 1:" in out
    assert main(["inspect", str(layout.stage_dir("packed")), "--row", "999999"]) == 2


def test_verify_refuses_a_truncated_copy(layout, tmp_path, capsys):
    import shutil

    src = layout.stage_dir("megatron")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    binf = tmp_path / "tiny_text_document.bin"
    binf.write_bytes(binf.read_bytes()[:-100])
    assert main(["verify", str(tmp_path / "tiny_text_document")]) == 1
    assert "bin" in capsys.readouterr().out.lower()
