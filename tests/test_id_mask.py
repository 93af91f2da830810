"""Runtime ID masking: allow-list logits masks from bands or IDs, numpy and torch, off by default."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megacpp_core import id_mask as M
from megacpp_core import tokenizer as T

VOCAB = 8192


@pytest.fixture(scope="module")
def manifest() -> dict:
    return {"vocab_size": VOCAB, "bands": T.band_layout(VOCAB, 3000, T.load_bands())}


def test_allowed_ids_from_bands_and_ids(manifest):
    ranges = M.band_ranges(manifest)
    ids = M.allowed_ids(manifest, bands=["special", "gpu"], ids=[T.EOS_ID, VOCAB - 1])
    gpu = np.arange(*ranges["gpu"])
    assert ids.dtype == np.int64 and np.all(np.diff(ids) > 0)
    assert set(ids.tolist()) == set(range(64)) | set(gpu.tolist()) | {VOCAB - 1}
    with pytest.raises(KeyError, match="unknown band 'sql'"):
        M.allowed_ids(manifest, bands=["sql"])
    with pytest.raises(ValueError):
        M.allowed_ids(manifest, ids=[VOCAB])
    with pytest.raises(ValueError):
        M.allowed_ids(manifest, ids=[-1])


def test_numpy_mask_and_softmax(manifest):
    allow = M.allowed_ids(manifest, bands=["keywords"], ids=[T.EOS_ID])
    mask = M.logits_mask(VOCAB, allow)
    assert mask.shape == (VOCAB,) and mask.dtype == np.float32
    assert np.all(mask[allow] == 0) and np.isneginf(np.delete(mask, allow)).all()
    logits = np.random.default_rng(0).normal(size=(2, 3, VOCAB)).astype(np.float32)
    m = M.IdMask.from_manifest(manifest, bands=["keywords"], ids=[T.EOS_ID], enabled=True)
    out = m.apply(logits)
    assert out.shape == logits.shape and out.dtype == np.float32
    probs = np.exp(out - out.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert np.allclose(probs[..., allow].sum(-1), 1.0)
    assert probs.argmax(-1).flatten().tolist() == [int(allow[np.argmax(row[allow])]) for row in logits.reshape(-1, VOCAB)]
    with pytest.raises(ValueError, match="empty"):
        M.logits_mask(VOCAB, [])
    with pytest.raises(ValueError, match="last dimension"):
        m.apply(np.zeros((2, VOCAB - 1), dtype=np.float32))


def test_off_by_default_passes_logits_through(manifest):
    m = M.IdMask.from_manifest(manifest, bands=["special"])
    assert m.enabled is False
    x = np.ones((1, VOCAB), dtype=np.float32)
    t = torch.ones(1, VOCAB)
    assert m.apply(x) is x and m.apply(t) is t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_mask_matches_numpy(manifest, dtype):
    m = M.IdMask.from_manifest(manifest, bands=["stl", "testing"], enabled=True)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = m.apply(logits)
    assert out.dtype == dtype and out.shape == logits.shape
    keep = torch.zeros(VOCAB, dtype=torch.bool)
    keep[torch.as_tensor(m.allow)] = True
    assert torch.isneginf(out[:, ~keep]).all() and torch.equal(out[:, keep], logits[:, keep])
    ref = m.apply(logits.float().numpy()) if dtype == torch.float32 else None
    if ref is not None:
        assert np.array_equal(out.numpy(), ref)
    probs = torch.softmax(out.float(), -1)
    assert torch.allclose(probs[:, keep].sum(-1), torch.ones(4))
    tm = M.torch_logits_mask(VOCAB, m.allow)
    assert tm.dtype == torch.float32 and int((tm == 0).sum()) == len(m.allow)
