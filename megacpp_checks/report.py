"""The outcome record shared by the verify gates (Megatron pairs and packed shards)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VerifyReport:
    """Outcome of a gate run: ``ok`` iff ``failures`` is empty; ``figures`` holds counts
    (sequences, documents, tokens, dtype, vocab_size, min/max token id, first tokens)."""

    ok: bool
    failures: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
