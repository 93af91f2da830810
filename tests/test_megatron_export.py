"""Document-level and row-level Megatron exports feed megatron-core's GPTDataset."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

from megacpp_core import pack
from megacpp_core.megatron import write_indexed_dataset

BOS, PAD, V, L = 2, 0, 131072, 64


class _Tok:
    """The few tokenizer attributes GPTDataset reads (eod, pad, identity for caching)."""

    eod, pad, bos, vocab_size = 3, PAD, BOS, V
    unique_identifiers = {"class": "megacpp-test"}


def _gpt(prefix, seq_len, samples, extra_token):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        from megatron.core.datasets.utils import Split
    cfg = GPTDatasetConfig(random_seed=1, sequence_length=seq_len, blend=None, split="1,0,0", tokenizer=_Tok(),
                           reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=False,
                           path_to_cache=None, mmap_bin_files=True, add_extra_token_to_sequence=extra_token)
    ind = IndexedDataset(str(prefix))
    return GPTDataset(ind, str(prefix), np.arange(len(ind.document_indices) - 1), samples, Split.train, cfg)


@pytest.fixture
def docs_and_rows():
    rng = np.random.default_rng(0)
    docs = []
    for i, n in enumerate(rng.integers(3, L, size=60)):
        ids = rng.integers(64, 5000, size=n).astype(np.uint32)
        ids[0] = BOS
        docs.append(pack.PackInput(ids, f"s/f{i}.c#0", "s", "r", f"f{i}.c", 0))
    return docs, pack.build_rows(docs, L, BOS, PAD)


def test_gpt_dataset_from_document_level_export(tmp_path, docs_and_rows):
    docs, _ = docs_and_rows
    write_indexed_dataset(tmp_path / "doc", (d.ids for d in docs), V)
    ds = _gpt(tmp_path / "doc", L, 20, extra_token=True)
    whole = [d.ids.astype(np.int64).tobytes() for d in docs]
    for i in range(len(ds)):
        s = ds[i]
        window = np.concatenate([s["tokens"].numpy(), s["labels"].numpy()[-1:]]).astype(np.int64)
        assert window.size == L + 1
        cuts = [0] + [int(j) for j in np.flatnonzero(window == BOS) if j > 0] + [window.size]
        pieces = [window[x:y].tobytes() for x, y in zip(cuts[:-1], cuts[1:]) if y > x]
        # a window of whole documents (shuffled by GPTDataset): inner pieces are whole
        # documents, the ends are a document's tail and head
        assert any(pieces[0] in w for w in whole)
        assert all(p in whole for p in pieces[1:-1])
        assert len(pieces) == 1 or any(w.startswith(pieces[-1]) for w in whole)


def test_gpt_dataset_from_row_level_export_yields_whole_rows(tmp_path, docs_and_rows):
    _, rows = docs_and_rows
    full = [np.asarray(r, dtype=np.uint32) for r in rows.column("input_ids").to_pylist()]
    write_indexed_dataset(tmp_path / "row", full, V)
    ds = _gpt(tmp_path / "row", L, len(full), extra_token=False)
    want = {r.tobytes() for r in (x.astype(np.int64) for x in full)}
    seen = set()
    for i in range(len(ds)):
        tokens = ds[i]["tokens"].numpy().astype(np.int64)
        assert tokens.size == L and tokens.tobytes() in want and tokens[0] == BOS
        seen.add(tokens.tobytes())
    assert seen == want  # every packed row is one sample, none split or merged


def test_pipeline_row_level_format_on_tiny(tiny_run, tmp_path):
    import dataclasses
    import shutil

    from megacpp_checks.verify import verify_megatron
    from megacpp_core import stages
    from megacpp_core.layout import SnapshotLayout
    from megacpp_core.manifest import load_manifest

    root, _ = tiny_run
    src, copy = SnapshotLayout(root, "tiny"), SnapshotLayout(tmp_path, "tiny")
    shutil.copytree(src.root, copy.root)  # the snapshot: its tokenized shards, chunk drops, tokenizer, packed rows
    m = load_manifest("tiny")
    m = dataclasses.replace(m, settings=dataclasses.replace(m.settings, megatron_export="row"))
    res = stages.run("format", copy.data_root, m)
    sentinel = pack.read_success(copy.stage_dir("packed"))
    assert res.figures["export_level"] == "row" and res.figures["documents"] == sentinel["rows"]
    assert res.figures["tokens"] == sentinel["rows"] * sentinel["row_length"]
    prefix = copy.root / res.figures["prefix"]
    assert verify_megatron(prefix, out=lambda x: None).ok and res.checks["verify_gate"][0]
    keys = pq.read_table(f"{prefix}.documents.parquet").column("doc_key").to_pylist()
    assert keys[0] == "row-0"
