"""Token ids of the tokenizer's training sample, kept for the stages that encode the same files.

The tokenizer stage's round-trip gate encodes every document of its training sample (every
kept file while they fit ``tokenizer_sample_bytes``). Those ids are written beside the
tokenizer as ``tokenizer/sample_ids.parquet`` (:data:`SCHEMA`: one row per sample file,
sorted by ``doc_key``, :data:`ROW_GROUP_ROWS` rows a row group, so a reader filtering on its
own keys reads only their row groups). Two later stages encode the same texts again:

* the chunk stage encodes every kept file whole for its exact budgets: it takes the ids of
  each file found here (:func:`read`) and encodes only the others;
* the ``p3_repo`` stage encodes each file after its path header (``path + "\\n" + text``):
  :func:`after_header` builds those ids from the file's own ids when the tokenizer's
  rules make the whole encoding the header's then the text's (see :func:`header_safe`),
  and the stage encodes the rest.

A row is used only when its ``content_sha256`` is the file's (the sha256 of its UTF-8
text, as in the ``scrubbed`` table), the ids were made by the same tokenizer (the file's
``megacpp.tokenizer_sha256`` metadata) and they decode to the text (:func:`verified`);
otherwise the file is encoded as before. The ids are then those
:func:`megacpp_core.tokenizer.encode` gives: the outputs do not change, only the work
(``tests/test_sample_ids.py``, on the real ``tiny`` snapshot and hostile headers and texts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Columns of ``sample_ids.parquet``: the file's ``doc_key`` and ``content_sha256`` (hex),
#: its token count and its ids (``uint32``, no BOS).
SCHEMA = pa.schema([("doc_key", pa.string()), ("content_sha256", pa.string()), ("n_tokens", pa.int64()),
                    ("ids", pa.large_list(pa.uint32()))])
#: Rows per row group (local choice: a few hundred files, so a shard's filtered read skips
#: the other shards' groups by their ``doc_key`` statistics).
ROW_GROUP_ROWS = 256
#: Parquet key-value metadata naming the tokenizer the ids were made with.
TOKENIZER_KEY = b"megacpp.tokenizer_sha256"


def table(keys: Sequence[str], sha256s: Sequence[str], ids: Sequence[np.ndarray], tokenizer_sha256: str) -> pa.Table:
    """The ``sample_ids`` table (:data:`SCHEMA`) of files ``keys`` with content hashes
    ``sha256s`` and ids ``ids`` (``uint32[n_i]`` each), sorted by ``doc_key``, with the
    tokenizer's sha256 in the schema metadata. Raises ``ValueError`` when the three lengths
    differ."""
    if not len(keys) == len(sha256s) == len(ids):
        raise ValueError(f"{len(keys)} keys, {len(sha256s)} hashes and {len(ids)} id lists")
    n = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, np.int64)  # large_list: a sample may hold over 2**31 tokens
    np.cumsum(n, out=offsets[1:])
    values = np.concatenate([np.asarray(x, np.uint32) for x in ids]) if len(ids) else np.zeros(0, np.uint32)
    t = pa.table([pa.array(list(keys), pa.string()), pa.array(list(sha256s), pa.string()), pa.array(n, pa.int64()),
                  pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint32()))], schema=SCHEMA)
    t = t.take(pc.sort_indices(t, sort_keys=[("doc_key", "ascending")]))
    return t.replace_schema_metadata({TOKENIZER_KEY: tokenizer_sha256.encode()})


def read(ref, keys: Sequence[str], sha256s: Sequence[str], tokenizer_sha256: str) -> list[np.ndarray | None]:
    """The sample ids of files ``keys`` (``doc_key``) with content hashes ``sha256s``, from
    the ``sample_ids`` input ``ref``: per file its ``uint32`` ids (a view of one buffer), or
    None when the file is not in the sample, its hash differs, or the file was made by
    another tokenizer than ``tokenizer_sha256`` (then every entry is None). Only the row
    groups holding ``keys`` are read."""
    out: list[np.ndarray | None] = [None] * len(keys)
    if not len(keys) or not ref.exists() or ref.metadata().get("tokenizer_sha256") != tokenizer_sha256:
        return out
    t = ref.read(columns=["doc_key", "content_sha256", "ids"],
                 filters=pc.field("doc_key").isin(pa.array(list(keys), pa.string())))
    if not t.num_rows:
        return out
    col = t.column("ids").combine_chunks()
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy(zero_copy_only=False)
    found = {k: (s, j) for j, (k, s) in enumerate(zip(t.column("doc_key").to_pylist(), t.column("content_sha256").to_pylist()))}
    for i, (k, s) in enumerate(zip(keys, sha256s)):
        hit = found.get(k)
        if hit is not None and hit[0] == s:
            out[i] = values[offsets[hit[1]]:offsets[hit[1] + 1]]
    return out


#: ``{tokenizer sha256: bool}``: :func:`header_safe`'s verdicts in this process.
_SAFE: dict[str, bool] = {}
#: The stand-in for a text's first character when a header is encoded alone (any ASCII
#: letter would do: it is a non-space character and one byte-level token).
STAND_IN = "x"


def header_safe(tok, tokenizer_sha256: str) -> bool:
    """Whether ``tok`` (the snapshot tokenizer, sha256 ``tokenizer_sha256``) cuts
    ``header + "\n" + text`` at the newline whenever ``text`` starts with a printable
    non-space ASCII character, so that the text's ids are its own:

    * ``encode_special_tokens`` is on, no truncation or padding, no normalizer, and the
      pre-tokenizer is :func:`megacpp_core.tokenizer.new_tokenizer`'s
      (:data:`~megacpp_core.tokenizer.CODE_PATTERN`, split ``isolated``, then byte-level
      without regex). No branch of that pattern matches a newline followed by a non-space
      character and it has no look-behind, so a match ends at the newline and the text's
      matches are those it has alone (BPE then works within each piece);
    * no added token (special ones included: a special token's match is skipped but still
      takes its characters from the other tokens' matching) has ``lstrip`` or ``rstrip``
      (which would take the newline in), holds a newline followed by such a character (it
      could span the boundary), or is ``single_word`` and ends with a newline (its
      right-neighbour test would read the text).

    What comes before the newline can still depend on what follows it: the look-ahead
    ``(?!\S)`` sees the text's first character, or the end of the piece when the text
    starts with an added token. :func:`after_header` therefore encodes the header both
    ways and uses it only when the two agree. Cached per sha256."""
    got = _SAFE.get(tokenizer_sha256)
    if got is None:
        got = _SAFE[tokenizer_sha256] = _header_safe(tok, tokenizer_sha256)
    return got


def _printable(c: str) -> bool:
    return "!" <= c <= "~"


def _header_safe(tok, tokenizer_sha256: str | None = None) -> bool:
    from . import snapshot_tokenizer
    from . import tokenizer as tk

    if not tok.encode_special_tokens or tok.truncation is not None or tok.padding is not None:
        return False
    if tok.normalizer is not None or tok.pre_tokenizer is None:
        return False
    if tok.pre_tokenizer.__getstate__() != tk.new_tokenizer(True).pre_tokenizer.__getstate__():
        return False
    for t in snapshot_tokenizer.added_tokens(tok, tokenizer_sha256).values():
        c = t.content
        if t.lstrip or t.rstrip or (t.single_word and c.endswith("\n")):
            return False
        if "\n" in c[:-1] and any(_printable(c[i + 1]) for i in range(len(c) - 1) if c[i] == "\n"):
            return False
    return True


def after_header(tok, tokenizer_sha256: str, header: str, text: str, ids: np.ndarray) -> np.ndarray | None:
    """The ids of ``header + "\n" + text`` (``uint32``) from ``ids``, the ids of ``text``
    alone, or None when that is not proven equal to encoding the whole (:func:`header_safe`
    is false, ``text`` is empty or starts with anything but a printable non-space ASCII
    character, or the header's ids depend on what follows it). The header's ids are
    those of ``header + "\n"`` when they equal the ids of ``header + "\n" + STAND_IN``
    without the stand-in's (its own last token): then neither answer of the look-ahead
    before the newline changes them (see :func:`header_safe`)."""
    if not text or not _printable(text[0]) or not header_safe(tok, tokenizer_sha256):
        return None
    head = tok.encode(f"{header}\n{STAND_IN}", add_special_tokens=False).ids
    if not head or head[-1] != tok.token_to_id(STAND_IN):
        return None
    if tok.encode(f"{header}\n", add_special_tokens=False).ids != head[:-1]:
        return None
    return np.concatenate([np.asarray(head[:-1], np.uint32), np.asarray(ids, np.uint32)])


def verified(tok, texts: Sequence[str], ids: Sequence[np.ndarray | None],
             tokenizer_sha256: str | None = None) -> list[np.ndarray | None]:
    """``ids`` with every entry whose ids' bytes are not exactly its text's UTF-8
    (``texts[i]``) replaced by None (that text is then encoded): a cheap guard against a
    damaged ``sample_ids`` file (the sha256 checks of :func:`read` guard the text and the
    tokenizer).

    The tokenizer is byte-level, so ids encode a text exactly when their bytes are its
    UTF-8: the bytes of all entries' ids are gathered with one arrow ``take`` of the
    tokenizer's byte table (:func:`megacpp_core.tokenize.ids_bytes`, the table kept per
    process by ``tokenizer_sha256``; the tokenize stage builds the same table) and each entry's
    are compared with its text's, instead of decoding every entry to a Python string
    (``decode_batch``: 0.25–0.27 s for the 735 sample files of ``default``, against
    0.07–0.12 s). Stricter than comparing the decoded string, which kept ids whose bytes
    are not UTF-8 when the text held the U+FFFD that the lossy decode puts there, and
    ids outside the vocabulary, which the decode skips: such an entry, a negative id and
    a text that is not UTF-8 (a lone surrogate) give None now; an entry of the
    tokenizer's own encoding of its text is kept either way, so the ids used, and the
    outputs, are the same."""
    from .tokenize import byte_array, ids_bytes

    todo = [i for i, x in enumerate(ids) if x is not None]
    out = list(ids)
    if not todo:
        return out
    vocab = len(byte_array(tok, tokenizer_sha256))
    sizes = np.array([len(ids[i]) for i in todo], dtype=np.int64)
    bounds = np.zeros(len(todo) + 1, np.int64)
    np.cumsum(sizes, out=bounds[1:])
    flat = np.concatenate([np.asarray(ids[i], dtype=np.int64) for i in todo]) if bounds[-1] else np.zeros(0, np.int64)
    outside = (flat < 0) | (flat >= vocab)
    bad = np.zeros(len(todo), bool)
    if outside.any():
        bad[np.searchsorted(bounds, np.flatnonzero(outside), side="right") - 1] = True
        flat = np.where(outside, 0, flat)
    offsets, data = ids_bytes(tok, tokenizer_sha256, flat, bounds)
    offsets, data = offsets.tolist(), data.to_pybytes()
    for k, i in enumerate(todo):
        try:
            same = not bad[k] and data[offsets[k]:offsets[k + 1]] == texts[i].encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no ids encode it
            same = False
        if not same:
            out[i] = None
    return out
