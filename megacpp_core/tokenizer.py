"""Stage 5: the hybrid C++ tokenizer: specials, fixed bands, seeded byte-level BPE (SPEC §4).

Built with HuggingFace ``tokenizers``: a BPE model over the 256-symbol byte alphabet, no
normalizer, a code-aware pre-tokenizer (:data:`CODE_PATTERN` split, then byte-level mapping
without regex), the byte-level decoder and no post-processor (BOS is inserted by the caller
as :data:`BOS_ID`, never by the tokenizer).

ID layout (contiguous, ``0 <= id < vocab_size``; see the background note seeds/004):

* ``special``  ``[0, 64)``: :data:`SPECIAL_TOKENS`, in order. Registered as special added
  tokens and never matched inside document text (``encode_special_tokens = True``).
* fixed bands, ``[64, 64 + F)``: hand-curated tokens from the versioned data files in
  ``megacpp_core/data/tokenizer_bands/VERSION/NN_band.txt`` (keywords, preprocessor,
  attributes, operators, numbers, indent, stl, gpu, testing), in file order. They are
  non-special added tokens (``normalized=False``): matched in the raw text before
  pre-tokenization, longest leftmost match first. Identifier-like bands use
  ``single_word=True`` so a fixed token only matches when neither neighbour is a letter,
  digit or ``_``: ``print``, ``integer``, ``do_something`` and ``end_point`` never contain
  ``int``, ``do`` or ``end``. Those bands also carry a one-leading-space variant
  (``" int"``) so a keyword costs one token, as in pure BPE. The pinned digest
  :data:`BANDS_SHA256` makes a changed band file an error: IDs only move with a new version.
* ``bpe``      ``[64 + F, 64 + F + learned)``: the byte alphabet, then the learned merges.
  Training is seeded with morphemes measured on the training corpus (``morphemes.txt``:
  ``std:: init read write buffer value index node ptr ...``): every seed found at least
  :data:`SEED_MIN_HITS` times in the corpus identifiers is added to the training stream
  as many times as it was found, so its merges come early.
* ``reserved`` ``[.., vocab_size)``: ``<RESERVED_BPE_i>`` special tokens that pad the ID
  space when the corpus cannot supply enough merges, so the vocabulary size is exact.

``tokenizers`` does not persist ``encode_special_tokens`` in ``tokenizer.json``;
:func:`load_tokenizer` re-applies it and :func:`encode` refuses a tokenizer without it.

Determinism: ``tokenizers`` 0.23.3 BPE training breaks merge-count ties by pair order, so
the trained JSON is byte-identical across processes and thread counts (checked with
``RAYON_NUM_THREADS=1`` against the default pool); no environment variable is needed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Iterable

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from megacpp_core.morphemes import measure_morphemes
from megacpp_core.tables import atomic_write_text, sha256_file

log = logging.getLogger("megacpp.tokenizer")

#: Number of special-token IDs at the bottom of the vocabulary (SPEC §4).
NUM_SPECIAL = 64
#: Default vocabulary size (SPEC §4).
DEFAULT_VOCAB_SIZE = 131072
#: Smallest accepted vocabulary: specials + fixed bands + 256 byte symbols fit with room for
#: merges (local guard, a power of two above the ~1.3k fixed IDs of band version v1).
MIN_VOCAB_SIZE = 4096
#: One past the largest accepted vocabulary: IDs are stored as uint32 (SPEC §4).
MAX_VOCAB_SIZE = 1 << 32
#: Default minimum pair frequency for a merge (SPEC §4).
DEFAULT_MIN_FREQUENCY = 2
#: A seed morpheme must occur this often in the corpus identifiers to be seeded (local choice:
#: ten sightings, so a seed is real corpus evidence and not a one-off).
SEED_MIN_HITS = 10
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "tokenizer_manifest.json"
#: Version of the fixed-band data files in use; the directory name under ``data/tokenizer_bands``.
BANDS_VERSION = "v1"
#: SHA-256 over the band files of :data:`BANDS_VERSION` (name, NUL, bytes, NUL, in name order).
#: Fixed IDs are stable only while these bytes are: edit a copy under a new version instead.
BANDS_SHA256 = "80ca8fbc78b1525bc5cfbaa19ef2acae847af3563316d623f1151bca5ccf9d15"

#: Pre-tokenizer split for the hybrid tokenizer (after the fixed tokens are cut out). Like
#: GPT-2's pattern, a word keeps one leading space, but tuned for C/C++: an identifier
#: includes ``_`` and digits (``do_something`` is one pre-token), may end in ``::``
#: (``std::`` is one pre-token, so BPE can merge it) and takes up to three following
#: punctuation characters (``size();``, ``ptr->``); a number may carry a hex/binary prefix, a
#: fraction and a suffix; a punctuation run takes the whitespace after it except the last
#: space. Chosen by held-out bytes/token in ``bench/tokenizer.py`` (GPT-2 regex 3.40,
#: identifiers only 3.72, this pattern 4.02 on the default corpus at vocab 131,072).
CODE_PATTERN = (
    r" ?[\p{L}_][\p{L}\p{N}_]*(?:::)?[^\s\p{L}\p{N}_:]{0,3}"
    r"| ?\p{N}[\p{N}\p{L}_']*(?:\.[\p{N}\p{L}_']*)?"
    r"| ?[^\s\p{L}\p{N}_]+(?:\s+(?!\S))?"
    r"|\s+(?!\S)|\s+"
)

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

_ESCAPES = {"s": " ", "t": "\t", "n": "\n", "\\": "\\"}


@dataclass(frozen=True)
class Band:
    """One fixed band from ``NN_name.txt``: its tokens in ID order and how they match.

    ``tokens`` already includes the one-leading-space variants (``[t, " " + t, ...]``) when
    the file says ``space_variant=1``; ``single_word`` is the ``AddedToken`` flag.
    """

    name: str
    file: str
    tokens: tuple[str, ...]
    single_word: bool


def _unescape(line: str, where: str) -> str:
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            if i + 1 >= len(line) or line[i + 1] not in _ESCAPES:
                raise ValueError(f"{where}: bad escape in {line!r} (known: \\s \\t \\n \\\\)")
            out.append(_ESCAPES[line[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _band_dir(version: str):
    return resources.files("megacpp_core") / "data" / "tokenizer_bands" / version


def bands_digest(version: str = BANDS_VERSION) -> str:
    """Hex SHA-256 over the ``*.txt`` files of band ``version`` (see :data:`BANDS_SHA256`)."""
    h = hashlib.sha256()
    for f in sorted((p for p in _band_dir(version).iterdir() if p.name.endswith(".txt")), key=lambda p: p.name):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _parse_band(name: str, file: str, text: str) -> Band:
    opts: dict[str, str] = {}
    raw: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#!"):
            opts.update(kv.split("=", 1) for kv in line[2:].split())
        elif line == "#" or line.startswith("# "):
            continue
        elif line:
            raw.append(_unescape(line, f"{file}:{n}"))
    if set(opts) != {"single_word", "space_variant"}:
        raise ValueError(f"{file}: header '#! single_word=0|1 space_variant=0|1' missing or incomplete")
    tokens: list[str] = []
    for t in raw:
        tokens.append(t)
        if opts["space_variant"] == "1":
            tokens.append(" " + t)
    return Band(name, file, tuple(tokens), opts["single_word"] == "1")


def load_bands(version: str = BANDS_VERSION, check_digest: bool = True) -> list[Band]:
    """The fixed bands of ``version`` in ID order (file-name order ``01_...``, ``02_...``).

    Raises ``RuntimeError`` when ``check_digest`` and the files differ from
    :data:`BANDS_SHA256` (fixed IDs would silently move), ``ValueError`` for a malformed
    file, an empty or duplicated token, or a token equal to a special token.
    """
    if check_digest and version == BANDS_VERSION and bands_digest(version) != BANDS_SHA256:
        raise RuntimeError(f"tokenizer band files {version} changed (sha256 {bands_digest(version)} != pinned "
                           f"{BANDS_SHA256}); fixed IDs must not move: add a new band version instead")
    bands = []
    seen = {t: "special" for t in SPECIAL_TOKENS}
    files = sorted((p for p in _band_dir(version).iterdir() if re.match(r"^\d\d_\w+\.txt$", p.name)), key=lambda p: p.name)
    if not files:
        raise ValueError(f"no band files for tokenizer band version {version!r}")
    for f in files:
        band = _parse_band(f.name[3:-4], f.name, f.read_text(encoding="utf-8"))
        for t in band.tokens:
            if not t:
                raise ValueError(f"{f.name}: empty token")
            if t in seen:
                raise ValueError(f"{f.name}: token {t!r} already in band {seen[t]}")
            seen[t] = band.name
        bands.append(band)
    return bands


def load_seed_morphemes(version: str = BANDS_VERSION) -> list[str]:
    """The candidate seed morphemes of ``morphemes.txt`` (file order, comments dropped)."""
    text = (_band_dir(version) / "morphemes.txt").read_text(encoding="utf-8")
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def fixed_tokens(version: str = BANDS_VERSION) -> list[str]:
    """Every fixed token in ID order; ``fixed_tokens()[i]`` has ID ``NUM_SPECIAL + i``."""
    return [t for b in load_bands(version) for t in b.tokens]


class TokenizerMismatchError(ValueError):
    """A tokenizer's SHA-256 or vocabulary size differs from what a pin or upstream recorded."""


@dataclass
class TokenizerBuild:
    """A trained tokenizer and its ID layout.

    ``vocab_size`` is exact (``tokenizer.get_vocab_size(with_added_tokens=True)``);
    ``fixed`` counts the fixed-band IDs ``[64, 64 + fixed)`` (0 for a pure byte-level
    build); ``learned`` counts the BPE IDs after them (byte alphabet + merges);
    ``reserved`` counts the ``<RESERVED_BPE_i>`` filler IDs at the top. ``bands`` is a list
    of ``{"name", "start", "end_exclusive", "count"}`` dicts (``special``, each fixed band,
    ``bpe``, ``reserved``) contiguous over ``[0, vocab_size)``. ``documents`` / ``text_bytes``
    count the training texts and their UTF-8 bytes; ``merges`` is the number of merge rules;
    ``seeds`` maps each seeded morpheme to its corpus hits; ``hybrid`` is False for the pure
    byte-level baseline.
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
    fixed: int = 0
    seeds: dict[str, int] = field(default_factory=dict)
    hybrid: bool = True
    json: str = ""  #: the serialization ``tokenizer`` was parsed from ("" unknown)


def _check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ValueError(f"vocab_size must be an int, got {vocab_size!r}")
    if not MIN_VOCAB_SIZE <= vocab_size < MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} outside [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}); "
            f"SPEC §4 sizes are 65536 and {DEFAULT_VOCAB_SIZE}"
        )


def band_layout(vocab_size: int, learned: int, bands: list[Band] | None = None) -> list[dict]:
    """``[{"name", "start", "end_exclusive", "count"}]`` for special, each fixed band, bpe, reserved."""
    edges = [("special", 0, NUM_SPECIAL)]
    at = NUM_SPECIAL
    for b in bands or []:
        edges.append((b.name, at, at + len(b.tokens)))
        at += len(b.tokens)
    edges += [("bpe", at, at + learned), ("reserved", at + learned, vocab_size)]
    return [{"name": n, "start": s, "end_exclusive": e, "count": e - s} for n, s, e in edges]


def new_tokenizer(hybrid: bool = True) -> Tokenizer:
    """An untrained byte-level BPE tokenizer (no normalizer/post-processor).

    ``hybrid=True``: :data:`CODE_PATTERN` split then byte-level mapping; ``False``: the
    plain GPT-2 byte-level pre-tokenizer (the baseline of ``bench/tokenizer.py``).
    """
    tok = Tokenizer(models.BPE(unk_token="<UNK>", byte_fallback=False))
    if hybrid:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(CODE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def _mark_fixed(tok: Tokenizer, bands: list[Band]) -> None:
    """Record the fixed tokens (trained as reserved vocab entries) as non-special added
    tokens in ``tok``'s serialization (its model, and so its merges, unchanged).

    ``add_tokens`` with an ``AddedToken`` whose content is already in the vocabulary keeps
    its id and records the new flags (``special=False``, the band's ``single_word``, no
    strip, not normalized) in the serialized tokenizer, exactly as editing its JSON does;
    but ``tokenizers`` keeps the token in its in-memory set of specials: :func:`train_tokenizer`
    parses its final serialization once (``tests/test_tokenizer.py`` compares with the JSON edit)."""
    flags = {t: b.single_word for b in bands for t in b.tokens}
    tok.add_tokens([AddedToken(t, special=False, single_word=w, lstrip=False, rstrip=False, normalized=False)
                    for t, w in flags.items()])


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = DEFAULT_MIN_FREQUENCY,
    hybrid: bool = True,
    seed: bool = True,
) -> TokenizerBuild:
    """Train the tokenizer on ``texts`` and pad the ID space to exactly ``vocab_size``.

    ``hybrid=True`` (default) builds the SPEC §4 layout: specials, the fixed bands of
    :data:`BANDS_VERSION`, then BPE seeded (``seed=True``) with the morphemes measured on
    ``texts``. ``hybrid=False`` is a pure byte-level BPE with only the specials (baseline).
    ``texts`` is scanned twice, at once (the morpheme count on a thread of its own while it
    is streamed into the trainer): a list, or any collection whose every ``iter()`` starts
    over independently (:class:`megacpp_core.kept.TextColumn`); a one-shot iterator is read
    into a list first. When the corpus yields fewer
    merges than needed, the remaining IDs become ``<RESERVED_BPE_i>`` special tokens and a
    warning is logged on ``megacpp.tokenizer``. Deterministic: same texts, same JSON bytes.

    Raises ``ValueError`` for a vocab size outside ``[4096, 2**32)`` or ``min_frequency < 1``;
    ``RuntimeError`` if the trained layout does not put every special and fixed token at its ID.
    """
    _check_vocab_size(vocab_size)
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be an int >= 1, got {min_frequency!r}")
    if iter(texts) is texts:
        texts = list(texts)
    bands = load_bands() if hybrid else []
    fixed = [t for b in bands for t in b.tokens]
    seeds: dict[str, int] = {}
    # The morphemes are counted on a thread of their own while the trainer reads the
    # texts (its word counting runs without the GIL); the seeds come after the texts.
    counting = ThreadPoolExecutor(1, thread_name_prefix="morphemes") if hybrid and seed else None
    stop = threading.Event()  # set when training ends early: the count is not needed then
    hits = counting.submit(measure_morphemes, texts, load_seed_morphemes(), stop) if counting is not None else None

    seen = [0, 0]  # training documents, their UTF-8 bytes

    def stream() -> Iterable[str]:
        for t in texts:
            seen[0] += 1
            seen[1] += len(t.encode("utf-8"))
            yield t
        if hits is not None:
            seeds.update((m, n) for m, n in hits.result().items() if n >= SEED_MIN_HITS)
        for m, n in seeds.items():  # whole-word occurrences, one per line: merges inside m come early
            yield "\n".join([m] * n)

    tok = new_tokenizer(hybrid)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + fixed,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    try:
        tok.train_from_iterator(stream(), trainer=trainer)
    finally:
        stop.set()
        if counting is not None:
            counting.shutdown(wait=True, cancel_futures=True)
    if fixed:
        _mark_fixed(tok, bands)  # in the serialization; parsed again below
    merges = len(json.loads(tok.model.__getstate__())["merges"])  # the model's own JSON, not the whole tokenizer's
    for i, token in enumerate(SPECIAL_TOKENS + fixed):
        if tok.token_to_id(token) != i:
            raise RuntimeError(f"token {token!r} trained at id {tok.token_to_id(token)}, expected {i}")
    trained = tok.get_vocab_size(with_added_tokens=True)
    reserved = vocab_size - trained
    learned = trained - NUM_SPECIAL - len(fixed)
    if reserved:
        tok.add_special_tokens([f"<RESERVED_BPE_{i}>" for i in range(reserved)])
        log.warning(
            "corpus supplied %d BPE ids (%d merges) for vocab_size %d; reserved %d ids as <RESERVED_BPE_i>",
            learned, merges, vocab_size, reserved,
        )
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"vocab size {tok.get_vocab_size(with_added_tokens=True)} != {vocab_size}")
    text = tok.to_str()  # the file's bytes (save_tokenizer); parsed once, so what is returned is what it holds
    tok = Tokenizer.from_str(text)
    tok.encode_special_tokens = True
    return TokenizerBuild(tok, vocab_size, learned, reserved, band_layout(vocab_size, learned, bands),
                          min_frequency, seen[0], seen[1], merges,
                          len(fixed), seeds, hybrid, text)


def tokenizer_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the bytes of ``tokenizer.json`` at ``path``. Raises ``OSError`` if unreadable."""
    return sha256_file(path)


def save_tokenizer(build: TokenizerBuild, directory: str | os.PathLike, extra: dict | None = None) -> dict:
    """Write ``tokenizer.json`` and ``tokenizer_manifest.json`` into ``directory``; return the manifest.

    The manifest lists every band's ID range and count, the ``tokenizers`` version, the
    tokenizer file's sha256 (``tokenizer_sha256``) and ``vocab_size`` — the two keys every
    downstream stage compares against — plus the band-file version/digest and seed hits.

    Both files are written atomically (tmp + rename); the tokenizer JSON (the text the
    build's tokenizer was parsed from, ``build.json``, when known) is compact and
    byte-deterministic, the manifest has sorted keys and indent 2. ``extra`` (e.g. snapshot
    name) is merged into the manifest; raises ``ValueError`` if it would overwrite a core key.
    """
    directory = Path(directory)
    tok_path = atomic_write_text(directory / TOKENIZER_FILE, build.json or build.tokenizer.to_str())  # what it was parsed from
    manifest = {
        "tokenizer_file": TOKENIZER_FILE,
        "tokenizer_sha256": tokenizer_sha256(tok_path),
        "tokenizers_version": tokenizers.__version__,
        "model": "bpe-byte-level-hybrid" if build.hybrid else "bpe-byte-level",
        "pre_tokenizer_pattern": CODE_PATTERN if build.hybrid else "gpt2-byte-level",
        "vocab_size": build.vocab_size,
        "fixed": build.fixed,
        "learned": build.learned,
        "merges": build.merges,
        "reserved": build.reserved,
        "bands": build.bands,
        "bands_version": BANDS_VERSION if build.hybrid else None,
        "bands_sha256": BANDS_SHA256 if build.hybrid else None,
        "seed_morphemes": dict(sorted(build.seeds.items())),
        "min_frequency": build.min_frequency,
        "training_documents": build.documents,
        "training_bytes": build.text_bytes,
        "special_tokens": SPECIAL_TOKENS,
        "encode_special_tokens": True,
        "pinned": None,
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


def tokenizer_from_json(text: str | bytes, expected_sha256: str | None = None, where: str = "tokenizer.json") -> Tokenizer:
    """:func:`load_tokenizer` from the bytes of a ``tokenizer.json`` (read through the data
    root). Raises :class:`TokenizerMismatchError` naming ``where`` and both hashes when
    ``expected_sha256`` is given and differs."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if expected_sha256 is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected_sha256.lower():
            raise TokenizerMismatchError(f"{where}: sha256 {actual} does not match expected {expected_sha256}")
    tok = Tokenizer.from_str(data.decode("utf-8"))
    tok.encode_special_tokens = True
    return tok


def pin_tokenizer(path: str | os.PathLike, sha256: str, vocab_size: int) -> tuple[Tokenizer, dict]:
    """Load a pinned ``tokenizer.json`` instead of training; return ``(tokenizer, layout)``.

    ``layout`` has ``vocab_size``, ``fixed``, ``learned``, ``reserved`` and ``bands``: the full
    hybrid band layout when every special and fixed token of :data:`BANDS_VERSION` sits at
    its ID, else ``special`` plus one ``pinned`` band for the rest. Raises
    :class:`TokenizerMismatchError` when the file's sha256 differs from ``sha256`` or its
    vocabulary size differs from ``vocab_size``, ``ValueError`` when a special token is not
    at its SPEC §4 ID, ``FileNotFoundError`` when missing.
    """
    tok = load_tokenizer(path, expected_sha256=sha256)
    n = tok.get_vocab_size(with_added_tokens=True)
    if n != vocab_size:
        raise TokenizerMismatchError(f"{path}: pinned tokenizer has vocab size {n}, manifest asks for {vocab_size}")
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise ValueError(f"{path}: pinned tokenizer has {t} at id {tok.token_to_id(t)}, SPEC §4 needs {i}")
    bands = load_bands()
    fixed = [t for b in bands for t in b.tokens]
    if all(tok.token_to_id(t) == NUM_SPECIAL + i for i, t in enumerate(fixed)):
        reserved = sum(1 for t in tok.get_added_tokens_decoder().values() if t.content.startswith("<RESERVED_BPE_"))
        learned = n - NUM_SPECIAL - len(fixed) - reserved
        layout = band_layout(n, learned, bands)
    else:
        fixed, reserved, learned = [], 0, n - NUM_SPECIAL
        layout = [{"name": "special", "start": 0, "end_exclusive": NUM_SPECIAL, "count": NUM_SPECIAL},
                  {"name": "pinned", "start": NUM_SPECIAL, "end_exclusive": n, "count": n - NUM_SPECIAL}]
    return tok, {"vocab_size": n, "fixed": len(fixed), "learned": learned, "reserved": reserved, "bands": layout}


def check_tokenizer_identity(info: dict, *, sha256: str | None = None, vocab_size: int | None = None,
                             where: str = "input") -> None:
    """Refuse a tokenizer that is not the one an artifact was made with.

    ``info`` is a tokenizer manifest (``tokenizer_sha256``, ``vocab_size``); ``sha256`` /
    ``vocab_size`` are what ``where`` recorded or requires (``None`` skips that comparison).
    Raises :class:`TokenizerMismatchError` naming ``where`` and both values.
    """
    if sha256 is not None and sha256.lower() != str(info.get("tokenizer_sha256", "")).lower():
        raise TokenizerMismatchError(f"{where}: made with tokenizer sha256 {sha256}, but the snapshot tokenizer is "
                                     f"{info.get('tokenizer_sha256')}; re-run the stages after the tokenizer")
    if vocab_size is not None and int(vocab_size) != int(info.get("vocab_size", -1)):
        raise TokenizerMismatchError(f"{where}: expects vocab size {vocab_size}, but the snapshot tokenizer has "
                                     f"{info.get('vocab_size')}; re-run the stages after the tokenizer")


def _require_literal_specials(tok: Tokenizer) -> None:
    if not tok.encode_special_tokens:
        raise ValueError("tokenizer matches special tokens in text; load it with load_tokenizer()")


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    """Token IDs of ``text``: 1-D ``uint32`` array, no BOS/EOS added.

    Raises ``ValueError`` if ``tok`` would turn literal ``<BOS>`` text into special IDs.
    """
    _require_literal_specials(tok)
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)


#: Texts per ``tokenizers`` batch call in :func:`encode_batch`. Implementation choice: an
#: ``Encoding`` holds its tokens' strings, offsets and masks beside the ids (about 150
#: bytes a token), so one call over a revision's 28,627 files (boost 1.81, 32 M tokens)
#: held 5.6 GB; a batch of 256 files holds a few MB and still fills both cores.
ENCODE_BATCH_TEXTS = 256


def ids_encoder(tok: Tokenizer):
    """``tok``'s batch encoder that gives the ids of :func:`encode` without computing
    offsets (``encode_batch_fast``; ``encode_batch`` on a ``tokenizers`` without it)."""
    return getattr(tok, "encode_batch_fast", None) or tok.encode_batch


def encode_batch(tok: Tokenizer, texts: Iterable[str]) -> list[np.ndarray]:
    """:func:`encode` for many texts (parallel in ``tokenizers``), :data:`ENCODE_BATCH_TEXTS`
    texts per call: ``[uint32[n_i]]``, in input order. Only the ids are kept (4 bytes a token)."""
    _require_literal_specials(tok)
    texts = list(texts)
    fast = ids_encoder(tok)
    out: list[np.ndarray] = []
    for lo in range(0, len(texts), ENCODE_BATCH_TEXTS):
        out += [np.asarray(e.ids, dtype=np.uint32) for e in fast(texts[lo:lo + ENCODE_BATCH_TEXTS], add_special_tokens=False)]
    return out


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


def check_round_trip(tok: Tokenizer, texts: Iterable[tuple[str, str]], batch: int = 256, keep=None) -> list[str]:
    """Keys of the ``(key, text)`` pairs whose ``decode(encode(text)) != text``, in input order.

    Texts are encoded (ids only, as :func:`encode_batch`) and decoded ``batch`` at a time,
    both in ``tokenizers``' thread pool; ``keep(keys, ids)``, when given, receives each
    batch's keys and id lists. An empty list means every text round-trips. Raises
    ``ValueError`` as :func:`encode`."""
    _require_literal_specials(tok)
    encode = ids_encoder(tok)
    failed: list[str] = []
    pairs = iter(texts)
    while chunk := list(islice(pairs, batch)):
        keys, docs = zip(*chunk)
        ids = [e.ids for e in encode(list(docs), add_special_tokens=False)]  # in range: no check as in decode()
        failed += [k for k, doc, back in zip(keys, docs, tok.decode_batch(ids, skip_special_tokens=False)) if back != doc]
        if keep is not None:
            keep(keys, ids)
    return failed
