"""The verify gate for Megatron ``.bin/.idx`` pairs (SPEC §7).

The producer writes a sidecar ``prefix.json`` next to the pair (:func:`write_sidecar`);
:func:`verify_megatron` checks the pair against it and collects every failure (no silent
fallback). Each failure reads ``<file>: <what is wrong> [<rule>]``. Run as
``python -m megacpp_checks.verify PREFIX|DIR``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from megacpp_core.megatron import (
    UINT16_VOCAB_LIMIT,
    IndexFormatError,
    IndexInfo,
    bin_path,
    idx_path,
    read_index,
)
from megacpp_core.tables import atomic_write_text, sha256_file

from .report import VerifyReport

#: ``<BOS>`` id: third of the tokenizer's special tokens ["<PAD>", "<UNK>", "<BOS>", "<EOS>"] (SPEC §5).
BOS_ID = 2
#: Tokens of document zero printed by the gate (SPEC §7).
PREVIEW_TOKENS = 64
#: Tokens per chunk of the sequential .bin scan (id range, first tokens): 64 MiB of int32.
SCAN_CHUNK_TOKENS = 1 << 24
SIDECAR_FORMAT = "megacpp-megatron-sidecar/1"
_SIDECAR_STR_KEYS = ("tokenizer_path", "tokenizer_sha256", "documents_path",
                     "document_key_column", "document_text_column")
#: Tokenizers document zero was decoded with in this process, by the sha256 of the file
#: bytes they were parsed from (one at a time): parsing a 131,072-id tokenizer.json takes
#: about 0.35 s, and a stage verifies its pair twice (before and after the commit).
_TOKENIZERS: dict[str, object] = {}


def sidecar_path(prefix: str | os.PathLike) -> Path:
    """``prefix.json``, the sidecar next to ``prefix.bin``/``prefix.idx``."""
    return Path(f"{os.fspath(prefix)}.json")


def write_sidecar(
    prefix: str | os.PathLike,
    *,
    vocab_size: int,
    tokenizer_path: str | os.PathLike,
    tokenizer_sha256: str,
    documents_path: str | os.PathLike,
    document_key_column: str = "doc_key",
    document_text_column: str = "text",
    extra: dict | None = None,
) -> Path:
    """Write ``prefix.json`` atomically (sorted keys, deterministic) and return its path.

    ``documents_path`` is a parquet file whose row i holds the source text of Megatron
    document i (without the BOS) in ``document_text_column`` and its key in
    ``document_key_column``. Paths are stored relative to the sidecar's directory.
    ``extra`` (e.g. export level, row length) is merged in without overriding core keys.
    Raises ``ValueError`` for a non-positive ``vocab_size`` or a clashing ``extra`` key.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    path = sidecar_path(prefix)
    here = path.parent.resolve()
    doc = {
        "format": SIDECAR_FORMAT,
        "vocab_size": int(vocab_size),
        "tokenizer_path": os.path.relpath(Path(tokenizer_path).resolve(), here),
        "tokenizer_sha256": tokenizer_sha256,
        "documents_path": os.path.relpath(Path(documents_path).resolve(), here),
        "document_key_column": document_key_column,
        "document_text_column": document_text_column,
    }
    clash = sorted(set(extra or {}) & set(doc))
    if clash:
        raise ValueError(f"extra sidecar keys {clash} clash with core keys")
    doc.update(extra or {})
    return atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _load_sidecar(path: Path, fail: Callable[[Path, str, str], None]) -> dict | None:
    """Parsed sidecar with its paths resolved, or None after recording why it is unusable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(path, f"unreadable sidecar: {e}", "sidecar")
        return None
    if not isinstance(doc, dict):
        fail(path, "sidecar is not a JSON object", "sidecar")
        return None
    wrong = [k for k in _SIDECAR_STR_KEYS if not isinstance(doc.get(k), str)]
    vocab = doc.get("vocab_size")
    if type(vocab) is not int or vocab <= 0:
        wrong.append("vocab_size")
    if wrong:
        fail(path, f"sidecar fields missing or mistyped: {wrong}", "sidecar")
        return None
    for key in ("tokenizer_path", "documents_path"):
        doc[key] = Path(os.path.normpath(path.parent / doc[key]))
    return doc


def _each_chunk(path: Path, dtype: np.dtype, count: int, step: Callable[[int, np.ndarray], bool | None]) -> None:
    """``step(first token offset, tokens)`` on the ``.bin`` in :data:`SCAN_CHUNK_TOKENS`-token
    chunks, each a read-only memory map of the file (no copy) unmapped right after its
    step: at most one chunk's pages are mapped, whatever the size of the dataset. ``step``
    must not keep the array; it returns True to stop."""
    itemsize = np.dtype(dtype).itemsize
    with open(path, "rb") as fh:
        for start in range(0, count, SCAN_CHUNK_TOKENS):
            size = min(SCAN_CHUNK_TOKENS, count - start)
            at = start * itemsize
            base = at - at % mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(fh.fileno(), at - base + size * itemsize, offset=base, access=mmap.ACCESS_READ) as mm:
                chunk = np.frombuffer(mm, dtype=dtype, count=size, offset=at - base)
                stop = step(start, chunk)
                del chunk  # no view may outlive the mapping
            if stop:
                return


def _scan_bin(path: Path, dtype: np.dtype, count: int, starts: np.ndarray, hasher=None
              ) -> tuple[int, int, np.ndarray]:
    """One sequential read of the ``.bin`` (:func:`_each_chunk`): ``(min, max, tokens at
    starts)``, with ``starts`` ``int64[d]`` ascending token offsets (the documents' first
    tokens). ``hasher`` (a ``hashlib`` object) is fed every byte, so the file's sha256
    comes from the same read. Where an extreme first occurs is :func:`_first_at`'s job,
    asked only when it is out of range."""
    extremes: list[int] = []
    firsts = np.empty(len(starts), dtype=np.int64)

    def step(start: int, chunk: np.ndarray) -> None:
        if hasher is not None:
            hasher.update(chunk)
        low, high = int(chunk.min()), int(chunk.max())
        extremes[:] = [low, high] if not extremes else [min(extremes[0], low), max(extremes[1], high)]
        a, b = np.searchsorted(starts, [start, start + chunk.size])
        firsts[a:b] = chunk[starts[a:b] - start]

    _each_chunk(path, dtype, count, step)
    return extremes[0], extremes[1], firsts


def _first_at(path: Path, dtype: np.dtype, count: int, value: int) -> int:
    """Token offset of the first ``value`` in the ``.bin`` (-1 when absent), chunk by chunk."""
    found = [-1]

    def step(start: int, chunk: np.ndarray) -> bool:
        hit = np.flatnonzero(chunk == value)
        if hit.size:
            found[0] = start + int(hit[0])
        return bool(hit.size)

    _each_chunk(path, dtype, count, step)
    return found[0]


def verify_megatron(
    prefix: str | os.PathLike,
    vocab_size: int | None = None,
    out: Callable[[str], object] = print,
    tokenizer_sha256: str | None = None,
    require_checksums: bool = False,
    tokenizer=None,
) -> VerifyReport:
    """Run the SPEC §7 gate on ``prefix.bin``/``prefix.idx``/``prefix.json``.

    In order: the three files present and non-empty; their sha256 equal the sidecar's
    ``bin_sha256`` / ``idx_sha256`` / ``documents_sha256`` (a flipped byte that keeps every
    id in range is still caught; ``require_checksums`` makes a sidecar without the first
    two a failure instead of a skipped check, as the pipeline's own gate does); the index parses (:func:`read_index`);
    ``.bin`` size == sum(lengths) × itemsize; dtype int32 when the vocabulary has ≥ 65,500
    ids (uint16 or int32 below); every id in ``[0, vocab_size)`` (the same sequential read
    of the ``.bin`` as its sha256, in memory-mapped chunks, :func:`_scan_bin`); the
    tokenizer file's sha256 matches the sidecar; every document starts with BOS id 2; the
    documents parquet has one row per document and document zero, BOS stripped, decodes
    exactly to row 0; then the first 64 tokens of document zero are printed. The documents
    parquet and the tokenizer file are hashed on a worker thread meanwhile (whole numpy
    arrays over the index and the maps; no Python step per document or token); failures
    are reported in the order above whatever finishes first.

    ``vocab_size`` defaults to the sidecar's; when given and different, that is a failure
    too and the given value is used. ``tokenizer_sha256``, when given, must equal the
    sidecar's (a pair made with another tokenizer is refused). ``tokenizer``, with
    ``tokenizer_sha256``: a ``tokenizers.Tokenizer`` the caller parsed from bytes of that
    sha256 (the producing stage's own); document zero is decoded with it when the
    sidecar's tokenizer file has exactly that sha256, instead of parsing the file again
    (a tokenizer the gate parses itself is kept for its next call, by the sha256 of the
    file bytes it was parsed from). Checks whose inputs failed earlier are skipped and
    listed in ``figures["skipped"]``. Never raises for bad data: every problem becomes a
    ``failures`` entry naming the file and the rule. ``out`` receives the progress lines.
    """
    failures: list[str] = []
    figures: dict = {"skipped": []}
    b, x, s = bin_path(prefix), idx_path(prefix), sidecar_path(prefix)

    def fail(path: Path, what: str, rule: str) -> None:
        failures.append(f"{path}: {what} [{rule}]")
        out(f"FAIL {failures[-1]}")

    def skip(check: str, why: str) -> None:
        figures["skipped"].append(check)
        out(f"SKIP {check}: {why}")

    present = {}
    for path in (b, x, s):
        present[path] = path.is_file() and path.stat().st_size > 0
        if not present[path]:
            fail(path, "missing" if not path.exists() else "empty", "present")

    sidecar = _load_sidecar(s, fail) if present[s] else None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify") as pool:
        # the side files (documents parquet, tokenizer) are hashed on the other core while
        # the .bin is hashed and scanned and row 0 read here; failures keep their order
        side = _SideReads(pool, sidecar) if sidecar is not None else None
        return _verify(prefix, vocab_size, out, tokenizer_sha256, require_checksums, tokenizer, failures, figures, fail,
                       skip, present, sidecar, side)


class _SideReads:
    """The gate's hashes of a sidecar's other files, started on a worker thread in the
    order the gate needs them: the documents parquet's sha256 and the tokenizer file's
    (streamed: its bytes are read again only to parse a tokenizer, :func:`_tokenizer`)."""

    def __init__(self, pool: ThreadPoolExecutor, sidecar: dict):
        docs = Path(sidecar["documents_path"])
        self.docs_sha256: Future = pool.submit(lambda: sha256_file(docs) if docs.is_file() else None)
        tok_file = Path(sidecar["tokenizer_path"])
        self.tokenizer_sha256: Future = pool.submit(lambda: sha256_file(tok_file) if tok_file.is_file() else None)


def _documents_row0(docs_file: Path, key_col: str, col: str) -> dict:
    """What the document-zero check reads of the documents parquet: ``{"error"}`` when it
    cannot be opened, else its column ``names``, ``num_rows`` and the ``source`` text of
    row 0 (None when it has no rows or lacks a column)."""
    try:
        pf = pq.ParquetFile(docs_file)
    except (OSError, ValueError) as e:
        return {"error": e}
    names = pf.schema_arrow.names
    rows = pf.metadata.num_rows
    source = None
    if rows and key_col in names and col in names:
        source = next(pf.iter_batches(batch_size=1, columns=[col], use_threads=False)).column(0)[0].as_py()
    return {"names": names, "num_rows": rows, "source": source}


def _verify(prefix, vocab_size, out, tokenizer_sha256, require_checksums, tokenizer, failures, figures, fail, skip,
            present, sidecar, side: _SideReads | None) -> VerifyReport:
    """The checks of :func:`verify_megatron` after the presence check and the sidecar's
    parse, in the same order, on ``side``'s reads."""
    b, x, s = bin_path(prefix), idx_path(prefix), sidecar_path(prefix)
    info: IndexInfo | None = None  # parsed first, its failure reported in its place below
    index_error = None
    if present[x]:
        try:
            info = read_index(x)
        except IndexFormatError as e:
            index_error = e
    bin_size = b.stat().st_size if info is not None and present[b] else None
    bin_ok = bin_size is not None and bin_size == info.bin_bytes
    if bin_ok:
        cum = np.concatenate([[0], np.cumsum(info.sequence_lengths, dtype=np.int64)])
        starts = cum[info.document_indices[:-1]]
        sizes = cum[info.document_indices[1:]] - starts
        nonempty = sizes > 0
        firsts = np.full(info.document_count, -1, dtype=np.int64)
    scan = None

    def read_bin(hashing: bool):
        """The .bin's sha256 (when ``hashing``) and its scan from one read of it."""
        hasher = hashlib.sha256() if hashing else None
        got = _scan_bin(b, info.dtype, info.token_count, starts[nonempty], hasher)
        return got, hasher.hexdigest() if hashing else None

    if sidecar is not None:
        checked = [(b, "bin_sha256"), (x, "idx_sha256"), (sidecar["documents_path"], "documents_sha256")]
        for path, key in checked:
            want = sidecar.get(key)
            if want is None and require_checksums and key != "documents_sha256":
                fail(s, f"the sidecar records no {key}", "sha256")
            elif want is None:
                skip(f"{key}", "the sidecar records no sha256 (written before payload checksums)")
            elif not Path(path).is_file():
                continue  # reported by the presence and doc0 checks
            else:
                if key == "documents_sha256":
                    got = side.docs_sha256.result()
                elif key == "bin_sha256" and bin_ok and info.token_count:
                    scan, got = read_bin(hashing=True)
                else:
                    got = sha256_file(path)
                if got == want:
                    continue
                fail(path, f"sha256 {got} != sidecar {key} {want}: the bytes changed after they were written",
                     "sha256")
        if vocab_size is not None and vocab_size != sidecar["vocab_size"]:
            fail(s, f"vocab_size {sidecar['vocab_size']} != expected {vocab_size}", "sidecar")
        vocab_size = vocab_size if vocab_size is not None else sidecar["vocab_size"]
        if tokenizer_sha256 is not None and tokenizer_sha256 != sidecar["tokenizer_sha256"]:
            fail(s, f"made with tokenizer sha256 {sidecar['tokenizer_sha256']}, expected {tokenizer_sha256}",
                 "tokenizer-sha256")
    figures["vocab_size"] = vocab_size

    if index_error is not None:
        fail(x, str(index_error).removeprefix(f"{x}: "), "index")
    if info is not None:
        figures.update(sequences=info.sequence_count, documents=info.document_count,
                       tokens=info.token_count, dtype=info.dtype.name)

    if bin_size is not None and not bin_ok:
        fail(b, f"{bin_size} bytes != sum(sequence lengths) {info.token_count} x itemsize "
                f"{info.dtype.itemsize} = {info.bin_bytes}", "bin-size")

    if info is not None and vocab_size is not None:
        allowed = ("int32",) if vocab_size >= UINT16_VOCAB_LIMIT else ("uint16", "int32")
        if info.dtype.name not in allowed:
            fail(x, f"dtype code {info.dtype_code}: {info.dtype.name} index cannot hold ids of a "
                    f"{vocab_size}-token vocabulary (allowed: {', '.join(allowed)})", "dtype")

    tokens = None
    if bin_ok and info.token_count:
        tokens = np.memmap(b, dtype=info.dtype, mode="r", shape=(info.token_count,))  # document zero only
        lo, hi, firsts[nonempty] = scan if scan is not None else read_bin(hashing=False)[0]
    if tokens is not None and vocab_size is not None:
        figures.update(min_token=lo, max_token=hi)
        ends = np.cumsum(info.sequence_lengths, dtype=np.int64)
        if lo < 0:
            lo_at = _first_at(b, info.dtype, info.token_count, lo)
            fail(b, f"negative token id {lo} at token {lo_at} (sequence "
                    f"{int(np.searchsorted(ends, lo_at, side='right'))})", "token-range")
        if hi >= vocab_size:
            hi_at = _first_at(b, info.dtype, info.token_count, hi)
            fail(b, f"token id {hi} >= vocab_size {vocab_size} at token {hi_at} (sequence "
                    f"{int(np.searchsorted(ends, hi_at, side='right'))})", "token-range")
    else:
        skip("token-range", "no readable tokens" if vocab_size is not None else "vocab_size unknown")

    row0 = None  # read here, while the worker hashes the tokenizer file; checked below, in its place
    if sidecar is not None and info is not None and bin_ok and info.document_count:
        row0 = _documents_row0(Path(sidecar["documents_path"]), sidecar["document_key_column"],
                               sidecar["document_text_column"])
    tok_file = sidecar["tokenizer_path"] if sidecar else None
    tok_digest = None
    if tok_file is None:
        skip("tokenizer-sha256", "no sidecar")
    elif not tok_file.is_file() or (tok_digest := side.tokenizer_sha256.result()) is None:
        fail(tok_file, "tokenizer file named by the sidecar is missing", "tokenizer-sha256")
    else:
        if tok_digest != sidecar["tokenizer_sha256"]:
            fail(tok_file, f"sha256 {tok_digest} != sidecar {sidecar['tokenizer_sha256']}", "tokenizer-sha256")

    doc0 = None
    if info is not None and bin_ok:
        bad = np.flatnonzero(~nonempty | (firsts != BOS_ID))
        if bad.size:
            d = int(bad[0])
            first = f"starts with {int(firsts[d])}" if nonempty[d] else "empty"
            fail(b, f"{bad.size} of {info.document_count} documents do not start with BOS id "
                    f"{BOS_ID} (first: document {d}, {first})", "bos")
        if info.document_count == 0:
            fail(x, "no documents", "doc0-roundtrip")
        else:
            doc0 = np.asarray(tokens[starts[0]:starts[0] + sizes[0]] if tokens is not None else [],
                              dtype=np.int64)
    else:
        skip("bos", "index or .bin unusable")

    tok = None
    if doc0 is not None and sidecar is not None and tok_digest is not None:
        given = tokenizer if tokenizer is not None and tokenizer_sha256 == tok_digest else None
        tok = _check_doc0(doc0, tok_file, tok_digest, given, sidecar, info.document_count, fail, row0)
    else:
        skip("doc0-roundtrip", "document zero, sidecar or tokenizer unavailable")

    if doc0 is not None:
        head = doc0[:PREVIEW_TOKENS].tolist()
        figures["first_tokens"] = head
        out(f"document 0, first {len(head)} tokens: {head}")
        if tok is not None:
            out(f"document 0, decoded: {tok.decode(head, skip_special_tokens=False)!r}")

    report = VerifyReport(ok=not failures, failures=failures, figures=figures)
    summary = ", ".join(f"{k}={figures[k]}" for k in ("documents", "tokens", "dtype", "vocab_size")
                        if k in figures)
    out(f"verify {prefix}: " + ("OK" if report.ok else f"FAILED ({len(failures)} failures)")
        + (f" ({summary})" if summary else ""))
    return report


def _tokenizer(tok_file: Path, digest: str, given=None):
    """The tokenizer of ``tok_file``, whose bytes hashed to ``digest``: ``given`` (parsed
    by the caller from bytes of that digest), else the one parsed here earlier from bytes
    of that digest, else parsed now from the file's bytes read again — only when they
    still hash to ``digest`` (``ValueError`` otherwise: the file changed while it was
    checked) — and kept (only tokenizers parsed here are kept). Raises whatever
    ``tokenizers`` raises for bad bytes."""
    from tokenizers import Tokenizer

    if given is not None:
        return given
    tok = _TOKENIZERS.get(digest)
    if tok is None:
        tok_bytes = tok_file.read_bytes()  # parsed from these very bytes, once they hash to digest
        if (now := hashlib.sha256(tok_bytes).hexdigest()) != digest:
            raise ValueError(f"the file changed while it was checked: sha256 {now}, was {digest}")
        tok = Tokenizer.from_buffer(tok_bytes)
        if hasattr(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True
        _TOKENIZERS.clear()
        _TOKENIZERS[digest] = tok
    return tok


def _check_doc0(doc0: np.ndarray, tok_file: Path, digest: str, given, sidecar: dict, n_docs: int,
                fail: Callable[[Path, str, str], None], row0: dict):
    """Decode document zero with the tokenizer of ``tok_file`` (whose bytes hashed to
    ``digest``; :func:`_tokenizer`) and compare it exactly with row 0 of the
    documents parquet (``row0``, :func:`_documents_row0`): the parquet must open, have the
    key and text columns and one row per Megatron document (``n_docs``).

    Returns the loaded ``tokenizers.Tokenizer`` (or None when it cannot be loaded).
    """
    try:
        tok = _tokenizer(tok_file, digest, given)
    except Exception as e:  # the tokenizers library raises its own exception types
        fail(tok_file, f"cannot load tokenizer: {e}", "doc0-roundtrip")
        return None
    docs_file, col = sidecar["documents_path"], sidecar["document_text_column"]
    if "error" in row0:
        fail(docs_file, f"cannot open documents parquet: {row0['error']}", "doc0-roundtrip")
        return tok
    names = row0["names"]
    missing = [c for c in (sidecar["document_key_column"], col) if c not in names]
    if missing:
        fail(docs_file, f"columns {missing} missing (has {names})", "doc0-roundtrip")
        return tok
    if row0["num_rows"] != n_docs:
        fail(docs_file, f"{row0['num_rows']} rows != {n_docs} Megatron documents", "doc0-roundtrip")
    if row0["num_rows"] == 0:
        return tok
    source = row0["source"]
    ids = doc0[1:] if doc0.size and doc0[0] == BOS_ID else doc0
    decoded = tok.decode(ids.tolist(), skip_special_tokens=False)
    if decoded != source:
        at = next((i for i, (p, q) in enumerate(zip(decoded, source)) if p != q),
                  min(len(decoded), len(source)))
        fail(docs_file, f"row 0 differs from decoded document zero at char {at} of "
                        f"{len(source)}/{len(decoded)}: source {source[at:at + 40]!r} vs decoded "
                        f"{decoded[at:at + 40]!r}", "doc0-roundtrip")
    return tok


def resolve_prefix(path: str | os.PathLike) -> str | None:
    """The dataset prefix for ``path`` (``.bin``/``.idx`` suffix stripped), or None when no
    ``.bin``, ``.idx`` or ``.json`` exists under it."""
    p = os.fspath(path)
    if p.endswith((".bin", ".idx")):
        p = p[:-4]
    return p if any(Path(p + ext).exists() for ext in (".bin", ".idx", ".json")) else None


def main_verify(path: str | os.PathLike, out: Callable[[str], object] = print) -> int:
    """Gate entry point; returns the exit code: 0 ok, 1 failures, 2 usage error.

    ``path`` is a Megatron prefix (with or without ``.bin``/``.idx``) or a packed-shard
    directory, on a local path or a data-root URL (``s3://…/snapshots/S/packed``, or
    ``s3://…/megatron/S_text_document``: the prefix's files are copied to a local scratch
    directory first, since the gate memory-maps them). Anything else is a usage error.
    """
    from megacpp_core.storage import DataRoot, is_url

    from megacpp_checks.packed import verify_packed_dir

    if is_url(path):
        s = os.fspath(path).rstrip("/")
        if DataRoot(s).exists("_SUCCESS"):
            return 0 if verify_packed_dir(s, out).ok else 1
        if s.endswith((".bin", ".idx")):
            s = s[:-4]
        parent, _, name = s.rpartition("/")
        root = DataRoot(parent)
        wanted = [k for k in root.list("") if "/" not in k and (k.startswith(name + ".") or k == "tokenizer.json")]
        if not any(k.endswith((".bin", ".idx", ".json")) and k.startswith(name + ".") for k in wanted):
            out(f"{path}: neither a Megatron dataset prefix (.bin/.idx/.json) nor a packed-shard directory [usage]")
            return 2
        with root.local_copy(wanted) as got:
            local = next(iter(got.values())).parent / name
            return 0 if verify_megatron(local, out=out).ok else 1
    if Path(path).is_dir():
        return 0 if verify_packed_dir(Path(path), out).ok else 1
    prefix = resolve_prefix(path)
    if prefix is None:
        out(f"{path}: neither a Megatron dataset prefix (.bin/.idx/.json) nor a directory [usage]")
        return 2
    return 0 if verify_megatron(prefix, out=out).ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m megacpp_checks.verify PREFIX|DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main_verify(sys.argv[1]))
