"""Per-specialist blends (megacpp_core.blends, SPEC §5b): the versioned blend file, its
rules, and megatron-core's BlendedMegatronDatasetBuilder drawing samples from our family
datasets for every specialist."""

from __future__ import annotations

import warnings

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


def test_megatron_core_builds_and_samples_every_specialists_blends(tiny_run):
    """The family datasets the tiny snapshot's run committed (``families/F/megatron``),
    p4_structure standing on p3_repo's ids until its stage exists (its planes live in the
    packed rows only): for every specialist, all four phases build with
    BlendedMegatronDatasetBuilder and GPTDatasetConfig and draw samples in the blend's
    proportions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    root, _ = tiny_run
    lay = SnapshotLayout(root, "tiny")
    prefixes = {f.name: str(lay.root / "families" / f.name / "megatron" / f"tiny_{f.name}_text_document")
                for f in families.FAMILIES if f.name != "p4_structure"}
    prefixes["p4_structure"] = prefixes["p3_repo"]
    b = blends.load()
    n = 40
    for name in blends.SPECIALISTS:
        for phase in (1, 2, 3, 4):
            paths, weights = blends.megatron_blend(b, name, phase, prefixes)
            seq = families.BY_NAME[next(iter(b.phase(name, phase).families))].row_length
            cfg = GPTDatasetConfig(random_seed=1, sequence_length=seq, blend=(paths, weights), split="1,0,0",
                                   tokenizer=_Tok(), reset_position_ids=True, reset_attention_mask=True,
                                   eod_mask_loss=False, path_to_cache=None, mmap_bin_files=True,
                                   create_attention_mask=False)  # a 65,536² mask is 17 GB; trainers derive it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [n, 0, 0], lambda: True, cfg).build()
            assert len(train) >= n
            for i in range(0, len(train), max(1, len(train) // 8)):
                tokens = train[i]["tokens"].numpy()
                assert tokens.size == seq and int(tokens.max()) < 131072
            if len(paths) > 1:
                got = np.bincount(np.asarray(train.dataset_index), minlength=len(paths)) / len(train.dataset_index)
                assert np.allclose(got, weights, atol=2 / n), (name, phase, got, weights)
