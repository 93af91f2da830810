"""Per-specialist blends (megacpp_core.blends and the blends asset, SPEC §5b): the
versioned blend file, its rules, the asset's Megatron --data-path lists and their gate, and
megatron-core's BlendedMegatronDatasetBuilder drawing samples from those lists over our
family datasets for every specialist and phase."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from megacpp_core import blends, families
from megacpp_core import tokenizer as tk
from megacpp_core.layout import SnapshotLayout


def test_packaged_blend_file_has_the_eight_diets():
    b = blends.load()
    assert b.version == blends.VERSION and tuple(b.specialists) == blends.SPECIALISTS
    for name, (title, phases) in b.specialists.items():
        assert title and sorted(phases) == [1, 2, 3, 4]
        assert sum(p.share for p in phases.values()) == pytest.approx(1.0)
        for ph, p in phases.items():
            assert all(families.BY_NAME[f].phase == ph for f in p.families)
    # the seed's words, as the numbers read them
    share = {n: {ph: p.share for ph, p in b.specialists[n][1].items()} for n in b.specialists}
    assert share["testing"][1] == max(s[1] for s in share.values())  # heaviest phase 1
    assert share["service_orchestration"][3] + share["service_orchestration"][4] > 0.6
    t1 = b.phase("templates", 1).families
    assert t1["p1_docrich"] > t1["p1_simple"]  # structured-doc shards first


def _write(tmp_path, mutate):
    raw = yaml.safe_load(blends.resources.files("megacpp_core").joinpath("data/blends/v1.yaml").read_text())
    mutate(raw)
    p = tmp_path / "v1.yaml"
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.update(version=2), "version"),
    (lambda r: r["specialists"].pop("testing"), "specialists"),
    (lambda r: r["specialists"]["testing"]["phases"][1]["families"].update(p2_file=1.0), "belongs to phase 2"),
    (lambda r: r["specialists"]["testing"]["phases"][1]["families"].update(p1_simple=0), "weight"),
    (lambda r: r["specialists"]["testing"]["phases"][1]["families"].update(p9_other=1), "unknown family"),
    (lambda r: r["specialists"]["testing"]["phases"][2].update(share=0.9), "sum to"),
    (lambda r: r["specialists"]["testing"]["phases"].pop(4), "phases"),
])
def test_a_broken_blend_file_is_refused_naming_the_rule(tmp_path, mutate, match):
    with pytest.raises(blends.BlendError, match=match):
        blends.load(_write(tmp_path, mutate))


def test_data_path_normalizes_weights_and_names_missing_datasets():
    b = blends.load()
    pre = {"p1_simple": "/d/p1_simple_text_document", "p1_docrich": "/d/p1_docrich_text_document"}
    assert blends.data_path(b, "algorithms", 1, pre) == ["0.850000", pre["p1_simple"], "0.150000", pre["p1_docrich"]]
    with pytest.raises(blends.BlendError, match="p2_file"):
        blends.data_path(b, "algorithms", 2, pre)
    with pytest.raises(blends.BlendError, match="unknown specialist"):
        b.phase("gardening", 1)


class _Tok:
    eod, pad, bos, vocab_size = tk.EOS_ID, tk.PAD_ID, tk.BOS_ID, 131072
    unique_identifiers = {"class": "megacpp-blend-test"}


def _blend_files(layout) -> dict:
    """The blends asset's own output: ``index.json`` and, per specialist and phase, the
    ``(weights, prefixes)`` of its ``phaseN.txt`` with the prefixes resolved against the
    snapshot directory."""
    import json

    d = layout.root / "blends"
    index = json.loads((d / "index.json").read_text())
    out = {}
    for name, spec in index["specialists"].items():
        for ph, e in spec["phases"].items():
            words = (d / e["file"]).read_text().split()
            out[(name, int(ph))] = ([float(w) for w in words[::2]], [str(layout.root / p) for p in words[1::2]], e)
    return index, out


def test_the_blends_asset_writes_every_specialists_data_path(tiny_run):
    """blends/SPECIALIST/phaseN.txt for the eight specialists and four phases: the blend
    file's normalized weights over the family prefixes (relative to the snapshot
    directory, so the bytes do not depend on where the data root is), each prefix a
    committed .bin/.idx, and the gate passed in the run."""
    from dagster import AssetCheckKey, AssetKey

    root, instance = tiny_run
    layout = SnapshotLayout(root, "tiny")
    index, got = _blend_files(layout)
    assert index["version"] == blends.VERSION and list(index["specialists"]) == sorted(blends.SPECIALISTS)
    assert sorted(got) == sorted((n, ph) for n in blends.SPECIALISTS for ph in blends.PHASES)
    b = blends.load()
    rel = {f.name: f"families/{f.name}/megatron/tiny_{f.name}_text_document" for f in families.FAMILIES}
    for (name, ph), (weights, prefixes, e) in got.items():
        assert e["data_path"] == blends.data_path(b, name, ph, rel)
        assert (layout.root / "blends" / e["file"]).read_text().split() == e["data_path"]
        assert sum(weights) == pytest.approx(1.0, abs=1e-5) and e["row_length"] == families.BY_NAME[e["families"][0]].row_length
        for p in prefixes:
            assert Path(p + ".bin").stat().st_size > 0 and Path(p + ".idx").stat().st_size > 0
    key = AssetCheckKey(AssetKey("blends"), "every_prefix_exists")
    assert instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key].evaluation.passed


def test_the_blends_gate_names_a_missing_prefix(tiny_run, tmp_path):
    """A family dataset whose .idx is gone: the blends gate fails naming it."""
    import shutil

    from megacpp_core import stages
    from megacpp_core.manifest import load_manifest

    root, _ = tiny_run
    src = SnapshotLayout(root, "tiny").root / "families"
    dst = tmp_path / "snapshots" / "tiny" / "families"
    for f in families.FAMILIES:
        shutil.copytree(src / f.name / "megatron", dst / f.name / "megatron")
    (dst / "p2_file" / "megatron" / "tiny_p2_file_text_document.idx").unlink()
    res = stages.run("blends", tmp_path, load_manifest("tiny"))
    ok, detail = res.checks["every_prefix_exists"]
    assert not ok and "families/p2_file/megatron/tiny_p2_file_text_document.idx" in detail


def test_megatron_core_builds_and_samples_every_specialists_blends(tiny_run, tmp_path):
    """From the blends asset's own files (blends/SPECIALIST/phaseN.txt over the family
    datasets the tiny snapshot's run committed): for every specialist, all four phases
    build with BlendedMegatronDatasetBuilder and GPTDatasetConfig and draw samples in the
    blend's proportions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    import torch.distributed as dist

    root, _ = tiny_run
    _, got = _blend_files(SnapshotLayout(root, "tiny"))
    n = 40
    built = set()
    # the index caches go to tmp_path, not next to the committed datasets; megatron-core
    # writes a cache on rank 0 only, so this is a one-rank job
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        _build_every_blend(got, n, tmp_path, built, BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig)
    finally:
        dist.destroy_process_group()
    assert len(built) == 32
    assert not [p for p in SnapshotLayout(root, "tiny").root.glob("families/*/megatron/*") if p.is_dir()]


def _build_every_blend(got, n, tmp_path, built, BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig):
    for name in blends.SPECIALISTS:
        for phase in blends.PHASES:
            weights, paths, e = got[(name, phase)]
            seq = e["row_length"]
            cfg = GPTDatasetConfig(random_seed=1, sequence_length=seq, blend=(paths, weights), split="1,0,0",
                                   tokenizer=_Tok(), reset_position_ids=True, reset_attention_mask=True,
                                   eod_mask_loss=False, path_to_cache=str(tmp_path / "cache"), mmap_bin_files=True,
                                   create_attention_mask=False)  # a 65,536² mask is 17 GB; trainers derive it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n, 0, 0], lambda: True, cfg).build()
            assert len(train) >= n
            for i in range(0, len(train), max(1, len(train) // 8)):
                tokens = train[i]["tokens"].numpy()
                assert tokens.size == seq and int(tokens.max()) < 131072
            if len(paths) > 1:
                got_share = np.bincount(np.asarray(train.dataset_index), minlength=len(paths)) / len(train.dataset_index)
                assert np.allclose(got_share, weights, atol=2 / n), (name, phase, got_share, weights)
            built.add((name, phase))
