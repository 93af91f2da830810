"""Runtime token-ID masking: an allow-list logits mask from tokenizer bands or IDs.

Per-specialist "sub-vocabularies" are not separate tokenizers: one shared tokenizer keeps
one stable ID layout, and a specialist may restrict decoding at logits time to an allowed
set of IDs (background note seeds/004, "runtime ID masking"). The mask is additive: ``0``
for allowed IDs and ``-inf`` elsewhere, applied before softmax. It is **off by default**:
:class:`IdMask` with ``enabled=False`` returns logits unchanged.

Bands are named as in ``tokenizer_manifest.json`` (``special``, ``keywords``, ``gpu``,
``bpe``, ``reserved`` ...), each an ``[start, end_exclusive)`` ID range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np


def band_ranges(manifest: dict) -> dict[str, tuple[int, int]]:
    """``{band name: (start, end_exclusive)}`` from a tokenizer manifest's ``bands`` list."""
    return {b["name"]: (int(b["start"]), int(b["end_exclusive"])) for b in manifest["bands"]}


def allowed_ids(manifest: dict, bands: Iterable[str] = (), ids: Iterable[int] = ()) -> np.ndarray:
    """Sorted unique ``int64`` IDs of the named ``bands`` plus the explicit ``ids``.

    Raises ``KeyError`` naming an unknown band and the known ones, ``ValueError`` for an ID
    outside ``[0, vocab_size)``.
    """
    ranges = band_ranges(manifest)
    vocab = int(manifest["vocab_size"])
    parts = []
    for name in bands:
        if name not in ranges:
            raise KeyError(f"unknown band {name!r}; known: {', '.join(ranges)}")
        parts.append(np.arange(*ranges[name], dtype=np.int64))
    extra = np.asarray(list(ids), dtype=np.int64)
    if extra.size and (extra.min() < 0 or extra.max() >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got min {extra.min()} max {extra.max()}")
    parts.append(extra)
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def logits_mask(vocab_size: int, allow: Iterable[int] | np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """Additive mask, shape ``(vocab_size,)``, ``dtype``: ``0`` at ``allow``, ``-inf`` elsewhere.

    Raises ``ValueError`` for an empty allow-list (softmax over nothing is undefined) or an
    ID outside ``[0, vocab_size)``.
    """
    allow = np.asarray(list(allow) if not isinstance(allow, np.ndarray) else allow, dtype=np.int64).ravel()
    if allow.size == 0:
        raise ValueError("empty allow-list: every logit would be -inf")
    if allow.min() < 0 or allow.max() >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got min {allow.min()} max {allow.max()}")
    mask = np.full(vocab_size, -np.inf, dtype=dtype)
    mask[allow] = 0
    return mask


def torch_logits_mask(vocab_size: int, allow: Iterable[int] | np.ndarray, dtype=None, device=None):
    """:func:`logits_mask` as a ``torch.Tensor`` (default dtype ``torch.float32``) on ``device``."""
    import torch

    return torch.as_tensor(logits_mask(vocab_size, allow), device=device).to(dtype or torch.float32)


@dataclass
class IdMask:
    """A reusable allow-list mask; ``enabled`` is False by default (logits pass through).

    ``allow`` holds the allowed IDs; :meth:`apply` adds the mask to logits of shape
    ``(..., vocab_size)`` (numpy array or torch tensor, any float dtype) and returns a new
    array/tensor of the same type, shape and dtype. Raises ``ValueError`` when the last
    dimension is not ``vocab_size``.
    """

    vocab_size: int
    allow: np.ndarray
    enabled: bool = False
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_manifest(cls, manifest: dict, bands: Iterable[str] = (), ids: Iterable[int] = (),
                      enabled: bool = False) -> "IdMask":
        """Mask allowing ``bands`` and ``ids`` of the tokenizer described by ``manifest``."""
        return cls(int(manifest["vocab_size"]), allowed_ids(manifest, bands, ids), enabled)

    def apply(self, logits):
        """``logits + mask`` when enabled, else ``logits`` itself (unchanged)."""
        if not self.enabled:
            return logits
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits last dimension {logits.shape[-1]} != vocab size {self.vocab_size}")
        if isinstance(logits, np.ndarray):
            return logits + logits_mask(self.vocab_size, self.allow, dtype=logits.dtype)
        key = (logits.dtype, logits.device)
        if key not in self._cache:
            self._cache[key] = torch_logits_mask(self.vocab_size, self.allow, logits.dtype, logits.device)
        return logits + self._cache[key]
