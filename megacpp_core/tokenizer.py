"""Stage 5: train, save, load and apply the byte-level BPE tokenizer (SPEC §4).

The tokenizer is HuggingFace ``tokenizers`` byte-level BPE: no normalizer, GPT-2 regex
pre-tokenization without a prefix space, the byte-level decoder and no post-processor
(BOS is inserted by the caller as :data:`BOS_ID`, never by the tokenizer).

ID layout (contiguous, ``0 <= id < vocab_size``):

* ``special``  ``[0, 64)``: :data:`SPECIAL_TOKENS`, in order.
* ``bpe``      ``[64, 64 + learned)``: the 256-symbol byte alphabet, then the learned merges.
* ``reserved`` ``[64 + learned, vocab_size)``: ``<RESERVED_BPE_i>`` special tokens that pad
  the ID space when the corpus cannot supply enough merges, so the vocabulary size is exact.

Special tokens are never matched inside document text: ``encode_special_tokens`` is set
to ``True`` so a file that literally contains ``<BOS>`` is encoded as ordinary bytes.
``tokenizers`` does not persist that flag in ``tokenizer.json``; :func:`load_tokenizer`
re-applies it and :func:`encode` refuses a tokenizer without it.

Determinism: ``tokenizers`` 0.23.3 BPE training breaks merge-count ties by pair order, so
the trained JSON is byte-identical across processes and thread counts (checked with
``RAYON_NUM_THREADS=1`` against the default pool); no environment variable is needed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megacpp_core.tables import atomic_write_text, sha256_file

log = logging.getLogger("megacpp.tokenizer")

#: Number of special-token IDs at the bottom of the vocabulary (SPEC §4).
NUM_SPECIAL = 64
#: Default vocabulary size (SPEC §4).
DEFAULT_VOCAB_SIZE = 131072
#: Smallest accepted vocabulary: 64 specials + 256 byte symbols, rounded up to 512 (local guard).
MIN_VOCAB_SIZE = 512
#: One past the largest accepted vocabulary: IDs are stored as uint32 (SPEC §4).
MAX_VOCAB_SIZE = 1 << 32
#: Default minimum pair frequency for a merge (SPEC §4).
DEFAULT_MIN_FREQUENCY = 2
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "tokenizer_manifest.json"

_NAMED_SPECIALS = [
    "<PAD>", "<UNK>", "<BOS>", "<EOS>",
    "<FIM_PREFIX>", "<FIM_MIDDLE>", "<FIM_SUFFIX>", "<FIM_PAD>",
    "<CODE_START>", "<CODE_END>",
    "<THINK_START>", "<THINK_END>", "<THINK_ERROR>", "<THINK_FIX>",
    "<THINK_TRACE>", "<THINK_VERIFY>", "<THINK_PLAN>",
    "<QUERY_TOOL>", "<TOOL_RESULT>",
    "<COMPILE_START>", "<COMPILE_END>",
    "<SCRIPT_START>", "<SCRIPT_END>",
    "<DIFF_START>", "<DIFF_END>",
    "<COMMENT_START>", "<COMMENT_END>",
    "<FILE_SEP>",
]
#: The 64 special tokens; list index == token ID (SPEC §4).
SPECIAL_TOKENS: list[str] = _NAMED_SPECIALS + [
    f"<RESERVED_SPECIAL_{k}>" for k in range(NUM_SPECIAL - len(_NAMED_SPECIALS))
]
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
assert len(SPECIAL_TOKENS) == NUM_SPECIAL and SPECIAL_TOKENS[BOS_ID] == "<BOS>"


class TokenizerMismatchError(ValueError):
    """A tokenizer file's SHA-256 differs from the hash recorded upstream."""


@dataclass
class TokenizerBuild:
    """A trained tokenizer and its ID layout.

    ``vocab_size`` is exact (``tokenizer.get_vocab_size(with_added_tokens=True)``);
    ``learned`` counts the BPE IDs ``[64, 64 + learned)`` (byte alphabet + merges);
    ``reserved`` counts the ``<RESERVED_BPE_i>`` filler IDs at the top. ``bands`` is a list
    of ``{"name", "start", "end_exclusive", "count"}`` dicts for ``special``, ``bpe`` and
    ``reserved``, contiguous over ``[0, vocab_size)``. ``documents`` / ``text_bytes`` count
    the training texts and their UTF-8 bytes; ``merges`` is the number of learned merge rules.
    """

    tokenizer: Tokenizer
    vocab_size: int
    learned: int
    reserved: int
    bands: list[dict]
    min_frequency: int = DEFAULT_MIN_FREQUENCY
    documents: int = 0
    text_bytes: int = 0
    merges: int = 0


def _check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ValueError(f"vocab_size must be an int, got {vocab_size!r}")
    if not MIN_VOCAB_SIZE <= vocab_size < MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} outside [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}); "
            f"SPEC §4 sizes are 65536 and {DEFAULT_VOCAB_SIZE}"
        )


def _bands(vocab_size: int, learned: int) -> list[dict]:
    edges = [("special", 0, NUM_SPECIAL), ("bpe", NUM_SPECIAL, NUM_SPECIAL + learned),
             ("reserved", NUM_SPECIAL + learned, vocab_size)]
    return [{"name": n, "start": s, "end_exclusive": e, "count": e - s} for n, s, e in edges]


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with the SPEC §4 pipeline (no normalizer/post-processor)."""
    tok = Tokenizer(models.BPE(unk_token="<UNK>", byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = DEFAULT_MIN_FREQUENCY,
) -> TokenizerBuild:
    """Train byte-level BPE on ``texts`` and pad the ID space to exactly ``vocab_size``.

    ``texts`` is consumed once (any iterable of ``str``). When the corpus yields fewer
    merges than needed, the remaining IDs become ``<RESERVED_BPE_i>`` special tokens and a
    warning is logged on ``megacpp.tokenizer``. Deterministic: same texts, same JSON bytes.

    Raises ``ValueError`` for a vocab size outside ``[512, 2**32)`` or ``min_frequency < 1``;
    ``RuntimeError`` if the trained layout does not match SPEC §4 (specials at 0-63).
    """
    _check_vocab_size(vocab_size)
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
    counts = [0, 0]

    def counted() -> Iterator[str]:
        for text in texts:
            counts[0] += 1
            counts[1] += len(text.encode("utf-8"))
            yield text

    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(counted(), trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != i:
            raise RuntimeError(f"special token {token} trained at id {tok.token_to_id(token)}, expected {i}")
    trained = tok.get_vocab_size(with_added_tokens=True)
    merges = len(json.loads(tok.to_str())["model"]["merges"])
    reserved = vocab_size - trained
    if reserved:
        tok.add_special_tokens([f"<RESERVED_BPE_{i}>" for i in range(reserved)])
        log.warning(
            "corpus supplied %d BPE ids (%d merges) for vocab_size %d; reserved %d ids as <RESERVED_BPE_i>",
            trained - NUM_SPECIAL, merges, vocab_size, reserved,
        )
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"vocab size {tok.get_vocab_size(with_added_tokens=True)} != {vocab_size}")
    tok.encode_special_tokens = True
    learned = trained - NUM_SPECIAL
    return TokenizerBuild(tok, vocab_size, learned, reserved, _bands(vocab_size, learned),
                          min_frequency, counts[0], counts[1], merges)


def tokenizer_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the bytes of ``tokenizer.json`` at ``path``. Raises ``OSError`` if unreadable."""
    return sha256_file(path)


def save_tokenizer(build: TokenizerBuild, directory: str | os.PathLike, extra: dict | None = None) -> dict:
    """Write ``tokenizer.json`` and ``tokenizer_manifest.json`` into ``directory``; return the manifest.

    Both files are written atomically (tmp + rename); the tokenizer JSON is compact and
    byte-deterministic, the manifest has sorted keys and indent 2. ``extra`` (e.g. snapshot
    name) is merged into the manifest; raises ``ValueError`` if it would overwrite a core key.
    """
    directory = Path(directory)
    tok_path = atomic_write_text(directory / TOKENIZER_FILE, build.tokenizer.to_str())
    manifest = {
        "tokenizer_file": TOKENIZER_FILE,
        "tokenizer_sha256": tokenizer_sha256(tok_path),
        "tokenizers_version": tokenizers.__version__,
        "model": "bpe-byte-level",
        "vocab_size": build.vocab_size,
        "learned": build.learned,
        "merges": build.merges,
        "reserved": build.reserved,
        "bands": build.bands,
        "min_frequency": build.min_frequency,
        "training_documents": build.documents,
        "training_bytes": build.text_bytes,
        "special_tokens": SPECIAL_TOKENS,
        "encode_special_tokens": True,
    }
    clash = sorted(set(extra or {}) & set(manifest))
    if clash:
        raise ValueError(f"extra manifest keys {clash} clash with core keys")
    manifest.update(extra or {})
    atomic_write_text(directory / MANIFEST_FILE, json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    return manifest


def load_tokenizer(path: str | os.PathLike, expected_sha256: str | None = None) -> Tokenizer:
    """Load ``tokenizer.json`` (``path`` is the file or its directory) with special-token matching off.

    Raises ``FileNotFoundError`` when missing and :class:`TokenizerMismatchError` naming the
    file and both hashes when ``expected_sha256`` is given and differs.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing (materialize the tokenizer asset first)")
    if expected_sha256 is not None:
        actual = tokenizer_sha256(path)
        if actual != expected_sha256.lower():
            raise TokenizerMismatchError(
                f"{path}: sha256 {actual} does not match expected {expected_sha256}"
            )
    tok = Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True
    return tok


def _require_literal_specials(tok: Tokenizer) -> None:
    if not tok.encode_special_tokens:
        raise ValueError("tokenizer matches special tokens in text; load it with load_tokenizer()")


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    """Token IDs of ``text``: 1-D ``uint32`` array, no BOS/EOS added.

    Raises ``ValueError`` if ``tok`` would turn literal ``<BOS>`` text into special IDs.
    """
    _require_literal_specials(tok)
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)


def encode_batch(tok: Tokenizer, texts: Iterable[str]) -> list[np.ndarray]:
    """:func:`encode` for many texts (parallel in ``tokenizers``); output order matches input."""
    _require_literal_specials(tok)
    encodings = tok.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]


def decode(tok: Tokenizer, ids: Iterable[int] | np.ndarray) -> str:
    """Exact inverse of :func:`encode`: nothing skipped, no spaces inserted.

    Raises ``ValueError`` for an ID outside ``[0, vocab_size)`` (``tokenizers`` would
    silently drop it). Valid IDs form one contiguous range, so checking the max suffices.
    """
    arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64).ravel()
    if arr.size and (arr.min() < 0 or tok.id_to_token(int(arr.max())) is None):
        raise ValueError(f"token id out of range: min {arr.min()}, max {arr.max()}")
    return tok.decode(arr.tolist(), skip_special_tokens=False)


def count_tokens(tok: Tokenizer, text: str) -> int:
    """Number of tokens :func:`encode` produces for ``text``."""
    _require_literal_specials(tok)
    return len(tok.encode(text, add_special_tokens=False))


def check_round_trip(tok: Tokenizer, texts: Iterable[tuple[str, str]], batch: int = 256) -> list[str]:
    """Keys of the ``(key, text)`` pairs whose ``decode(encode(text)) != text``, in input order.

    Texts are encoded ``batch`` at a time. An empty list means every text round-trips.
    """
    failed: list[str] = []
    pairs = iter(texts)
    while chunk := list(islice(pairs, batch)):
        keys, docs = zip(*chunk)
        for key, doc, ids in zip(keys, docs, encode_batch(tok, docs)):
            if decode(tok, ids) != doc:
                failed.append(key)
    return failed
