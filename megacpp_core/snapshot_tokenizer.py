"""The snapshot tokenizer as later stages read it: the ``tokenizer`` and
``tokenizer_manifest`` outputs of the tokenizer stage, loaded and cross-checked."""

from __future__ import annotations

import hashlib

from . import tokenizer as tk

#: Tokenizers parsed in this process, by the sha256 of their file: ``megacpp run`` runs
#: every shard in one process, and parsing a 131,072-id tokenizer.json costs about 0.35 s.
#: The stages only encode and decode with it (never add tokens or set padding).
_PARSED: dict[str, object] = {}
#: ``{uri: (version token, sha256, bytes)}`` of the tokenizer file this process read and
#: hashed last: a later stage finding the same version token (the file not replaced or
#: rewritten since, :meth:`~megacpp_core.storage.DataRoot.version`) does not read and
#: hash its 8 MB again (about 30 ms, at every one of the five stages of each shard).
_READ: dict[str, tuple[tuple, str, bytes]] = {}


def load(ctx):
    """``(tokenizer, manifest)`` from a stage's declared ``tokenizer`` and
    ``tokenizer_manifest`` inputs; the manifest gains ``sha256`` (= ``tokenizer_sha256``).
    Raises :class:`megacpp_core.tokenizer.TokenizerMismatchError` when the file's sha256 is
    not the one its manifest records, and ``MissingOutputError`` when either is missing."""
    tok, info, _ = load_with_bytes(ctx)
    return tok, info


def load_with_bytes(ctx):
    """:func:`load` plus the bytes of the ``tokenizer`` file it read and hashed
    (``(tokenizer, manifest, bytes)``), for a stage that copies the file into its output
    without reading it again. Same errors as :func:`load`."""
    info = dict(ctx.input("tokenizer_manifest").read_json())
    info["sha256"] = info["tokenizer_sha256"]
    ref = ctx.input("tokenizer")
    token = ref.version()  # before the read: a file replaced meanwhile is read again next time
    kept = _READ.get(ref.uri)
    if token is not None and kept is not None and kept[0] == token:
        digest, data = kept[1], kept[2]
    else:
        data = ref.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        _READ.clear()
        if token is not None:
            _READ[ref.uri] = (token, digest, data)
    tok = _PARSED.get(digest) if digest == info["sha256"].lower() else None
    if tok is None:
        tok = tk.tokenizer_from_json(data, info["sha256"], where=ref.uri)  # raises on a mismatch
        _PARSED.clear()  # one snapshot tokenizer at a time
        _PARSED[digest] = tok
    return tok, info, data


def parsed(sha256: str):
    """The tokenizer this process parsed from file bytes whose sha256 is ``sha256`` (hex),
    kept by :func:`load`; None when it has not (no file is read)."""
    return _PARSED.get(sha256.lower()) if isinstance(sha256, str) else None


#: ``{sha256: added tokens}`` of the last snapshot tokenizer :func:`added_tokens` was asked about.
_ADDED: dict[str, dict] = {}


def added_tokens(tok, sha256: str | None = None) -> dict:
    """``tok.get_added_tokens_decoder()`` (``{id: tokenizers.AddedToken}``). With
    ``sha256`` (of the ``tokenizer.json`` ``tok`` was parsed from, which the stages never
    change), the dict is kept for the latest sha256 and given again: a hybrid
    vocabulary's 31,000 added tokens take about 80 ms to convert, and four preparations
    of one stage step ask for them (the FIM byte table, the span counter's margin and
    prefixes, the sample ids' header check). Without, it is converted each time. Callers
    must not change the dict."""
    if not sha256:
        return tok.get_added_tokens_decoder()
    got = _ADDED.get(sha256)
    if got is None:
        got = tok.get_added_tokens_decoder()
        _ADDED.clear()
        _ADDED[sha256] = got
    return got
