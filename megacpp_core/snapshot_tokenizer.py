"""The snapshot tokenizer as later stages read it: the ``tokenizer`` and
``tokenizer_manifest`` outputs of the tokenizer stage, loaded and cross-checked."""

from __future__ import annotations

from . import tokenizer as tk


def load(ctx):
    """``(tokenizer, manifest)`` from a stage's declared ``tokenizer`` and
    ``tokenizer_manifest`` inputs; the manifest gains ``sha256`` (= ``tokenizer_sha256``).
    Raises :class:`megacpp_core.tokenizer.TokenizerMismatchError` when the file's sha256 is
    not the one its manifest records, and ``MissingOutputError`` when either is missing."""
    info = dict(ctx.input("tokenizer_manifest").read_json())
    info["sha256"] = info["tokenizer_sha256"]
    ref = ctx.input("tokenizer")
    tok = tk.tokenizer_from_json(ref.read_bytes(), info["sha256"], where=ref.uri)
    return tok, info
