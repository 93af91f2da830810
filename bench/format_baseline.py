"""The format stage as it was before the whole-array export and the threaded gate
(commit eea6766), kept for ``bench/format.py``'s side-by-side: ``baseline_stage()`` is the
format :class:`~megacpp_core.stage.Stage` with that compute and verify gate. Its outputs are
the same bytes as the current stage's (the bench checks it).

Only the functions that changed are copied here; the unchanged helpers (byte table, text
splice, index parser, sidecar, .bin scan, tokenizer cache, row-level export) are imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from megacpp_checks.report import VerifyReport
from megacpp_checks import verify as _verify_module
from megacpp_checks.verify import BOS_ID, PREVIEW_TOKENS, SCAN_CHUNK_TOKENS, _load_sidecar, sidecar_path, write_sidecar
from megacpp_core import kept, megatron, pack, pack_inputs, snapshot_tokenizer
from megacpp_core.fim import (_SEGMENTS, FIM_MIDDLE_ID, FIM_PREFIX_ID, FIM_SUFFIX_ID, MARKERS, FimConfig, decide)
from megacpp_core.megatron import UINT16_VOCAB_LIMIT, IndexFormatError, IndexInfo, bin_path, idx_path, read_index
from megacpp_core.megatron_export import BACKEND, COLUMNS, _starts, decoded_texts, splice_texts
from megacpp_core.stage import Files, Result, StageError
from megacpp_core.stages import format as fmt
from megacpp_core.tables import ParquetStream, sha256_file


# ---------------------------------------------------------------- fim (per-document draws)

def decide_all(doc_keys, lengths: np.ndarray, cfg: FimConfig, row_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mode, a, b)`` arrays for BOS-prefixed documents of ``lengths`` tokens (BOS
    included): ``mode`` int8 0 (left whole), 1 (PSM) or 2 (SPM), the cuts of
    :func:`decide` — exactly :func:`apply_fim`'s choice per document, a drawn document
    whose markers would overflow ``row_length`` left whole. With ``rate == 0`` nothing is
    drawn (no hashing)."""
    n = np.asarray(lengths, dtype=np.int64)
    mode, a, b = np.zeros(n.size, np.int8), np.zeros(n.size, np.int64), np.zeros(n.size, np.int64)
    if cfg.rate <= 0:
        return mode, a, b
    for i, (key, m) in enumerate(zip(doc_keys, n.tolist())):
        got, x, y = decide(key, m - 1, cfg)
        if got != "none" and m + MARKERS <= row_length:
            mode[i], a[i], b[i] = (1 if got == "psm" else 2), x, y
    return mode, a, b


def permute_ids(flat: np.ndarray, lengths: np.ndarray, doc_keys, cfg: FimConfig, row_length: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FIM's id moves for many BOS-prefixed documents at once, with numpy over the flat ids.

    ``flat`` holds the documents' ids back to back (``lengths`` tokens each, BOS included),
    ``doc_keys`` their keys. Returns ``(ids, lengths, drawn)``: the documents after FIM,
    back to back, their lengths (3 more for a transformed document) and the bool mask of
    the transformed ones. Each document's ids are exactly ``apply_fim(doc).doc.ids``
    (:func:`decide_all`, :func:`permutation`, :func:`marker_ids`); only the ids move, so
    the doc-comment policy (a loss mask) plays no part. Every document is cut into the
    seven segments of its layout (whole, or BOS, markers and pieces) and all are gathered
    with one index array."""
    n = np.asarray(lengths, dtype=np.int64)
    mode, a, b = decide_all(doc_keys, n, cfg, row_length)
    drawn = mode > 0
    if not drawn.any():
        return flat, np.asarray(lengths), drawn
    start = np.zeros(n.size, np.int64)
    np.cumsum(n[:-1], out=start[1:])
    src = np.zeros((n.size, _SEGMENTS), np.int64)  # first source token of each segment (0 for a marker)
    size = np.zeros((n.size, _SEGMENTS), np.int64)
    mark = np.full((n.size, _SEGMENTS), -1, np.int64)  # marker id, -1 for none
    psm = mode == 1
    body = start + 1
    pieces = {"pre": (body, a), "mid": (body + a, b - a), "suf": (body + b, n - 1 - b)}
    layout = {1: ("P", "pre", "S", "suf", "M", "mid"), 2: ("P", "S", "suf", "M", "pre", "mid")}
    ids = {"P": FIM_PREFIX_ID, "S": FIM_SUFFIX_ID, "M": FIM_MIDDLE_ID}
    src[:, 0], size[:, 0] = start, np.where(drawn, 1, n)
    for col in range(1, _SEGMENTS):
        for m, sel in ((1, psm), (2, mode == 2)):
            what = layout[m][col - 1]
            if what in ids:
                size[sel, col], mark[sel, col] = 1, ids[what]
            else:
                src[sel, col], size[sel, col] = pieces[what][0][sel], pieces[what][1][sel]
    src, size, mark = src.ravel(), size.ravel(), mark.ravel()
    out_start = np.zeros(size.size, np.int64)
    np.cumsum(size[:-1], out=out_start[1:])
    take = np.repeat(src - out_start, size)
    take += np.arange(take.size, dtype=np.int64)
    out = np.asarray(flat)[take]
    is_marker = mark >= 0
    out[out_start[is_marker]] = mark[is_marker]
    return out, n + MARKERS * drawn, drawn


# ---------------------------------------------------------------- megatron_export

def gate_tokenizer(ctx, tokenizer_sha256: str):
    """The snapshot tokenizer a stage parsed (:func:`megacpp_core.snapshot_tokenizer.load`,
    kept per process) for its verify gate to decode document zero with, when its sha256 is
    ``tokenizer_sha256``; None otherwise, or when it cannot be loaded (the gate then parses
    the committed ``tokenizer.json`` itself)."""
    try:
        tok, info = snapshot_tokenizer.load(ctx)
    except (OSError, ValueError, KeyError):
        return None
    return tok if info["sha256"] == tokenizer_sha256 else None


def read_shard(ref, source_order: dict[str, int], drops: pa.Array) -> pa.Table:
    """One document shard's :data:`COLUMNS` and order columns but the ``doc_key`` values in
    ``drops``, in :func:`megacpp_core.kept.document_order` — as
    :func:`megacpp_core.kept.read_documents` of the one shard, read through its parquet
    file and copied by the filter only when it drops a row."""
    cols = list(dict.fromkeys(COLUMNS + kept.DOCUMENT_ORDER_COLUMNS))
    if hasattr(ref, "parquet_file"):
        with ref.parquet_file() as pf:
            t = pf.read(columns=cols)
    else:  # a reader with ``read`` alone
        t = ref.read(columns=cols)
    if drops is not None and len(drops) and t.num_rows:
        keep = pc.invert(pc.is_in(t.column("doc_key"), value_set=drops))
        if not pc.all(keep).as_py():
            t = t.filter(keep)
    return kept.document_order(t, source_order) if t.num_rows else t


def shard_documents(docs: pa.Table, settings, tok, tokenizer_sha256: str | None, vocab_size: int
                    ) -> tuple[np.ndarray, np.ndarray, pa.Table]:
    """One shard's documents (``doc_key``, ``text``, ``input_ids``, in keep order) as the
    export writes them: ``(ids, lengths, documents)`` — the ids after FIM back to back,
    each document's length, and its ``(doc_key, text)`` table (a FIM document's text
    decoded from its ids, :func:`decoded_texts`; the others' text as read). ``ValueError``
    naming the document for an id outside ``[0, vocab_size)``."""
    col = docs.column("input_ids").combine_chunks()
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.uint32, copy=False)  # as pack_inputs reads them
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    keys = docs.column("doc_key").combine_chunks()
    cfg = pack_inputs.fim_config(settings)
    ids, lengths, drawn = permute_ids(flat, lengths, keys.to_pylist() if cfg.rate > 0 else (), cfg,
                                          settings.row_length)
    if ids.size and int(ids.max()) >= vocab_size:
        bad = int(np.argmax(ids >= vocab_size))
        doc = int(np.searchsorted(_starts(lengths), bad, side="right")) - 1
        raise ValueError(f"document {doc} ({keys[doc].as_py()}): token id {int(ids[bad])} >= vocab_size {vocab_size}")
    texts = docs.column("text").combine_chunks()
    if drawn.any():
        fim_texts = decoded_texts(ids[np.repeat(drawn, lengths)], lengths[drawn], tok, tokenizer_sha256)
        texts = (splice_texts(texts, drawn, fim_texts) if not texts.null_count
                 else pc.replace_with_mask(pc.cast(texts, pa.large_string()), pa.array(drawn), fim_texts))
    return ids, lengths, pa.table({"doc_key": keys, "text": pc.cast(texts, pa.large_string())})


def document_level(refs: list, drops: pa.Array, source_order: dict[str, int], settings, tok, info: dict, d: Path,
                   prefix: Path, docs_out: ParquetStream) -> dict:
    """Write ``prefix.bin/.idx`` (int32 ids) from the document shards ``refs`` (input
    references of ``tokenized``-like tables with :data:`COLUMNS` and the order columns)
    but the ``doc_key`` values in ``drops``; ``settings`` gives the row length and FIM
    (:func:`megacpp_core.pack_inputs.fim_config`), ``info`` the tokenizer's ``sha256``
    and ``vocab_size``; ``d`` is local scratch space (unused: the pair is written in
    place, atomically). Each shard's documents, in keep order, after FIM — exactly the
    sequences that enter the rows (:func:`shard_documents`) — are appended to the pair,
    and ``(doc_key, text)`` of each sequence goes to ``docs_out``. Memory is one shard's
    ids and texts: the enrichment planes and the chunk graph are not read, since FIM
    draws its spans from the ``doc_key`` and the length only
    (:func:`megacpp_core.fim.decide`). Returns ``{"sequences", "documents", "tokens",
    "dtype", "backend", "bin_sha256", "idx_sha256", "parts"}`` (``parts``: the shards
    that had documents). ``ValueError`` naming the shard for an id outside the
    vocabulary; nothing is left at ``prefix`` then."""
    vocab_size = info["vocab_size"]
    dtype = megatron.megatron_dtype(vocab_size)
    digest = hashlib.sha256()
    parts = sequences = tokens = 0
    with megatron.atomic_builder(prefix, dtype, BACKEND) as (builder, _, tmp_idx):
        for j, ref in enumerate(refs):
            docs = read_shard(ref, source_order, drops)
            if not docs.num_rows:
                continue
            try:
                ids, lengths, table = shard_documents(docs, settings, tok, info["sha256"], vocab_size)
            except ValueError as e:
                raise ValueError(f"shard {j} ({getattr(ref, 'uri', ref)}): {e}") from e
            out = ids.astype(dtype, copy=False)
            digest.update(out)
            builder.add_documents(out, lengths)
            docs_out.write(table)
            parts, sequences, tokens = parts + 1, sequences + len(lengths), tokens + out.size
        builder.finalize(tmp_idx)
    return {"sequences": sequences, "documents": sequences, "tokens": tokens, "dtype": dtype.name, "backend": BACKEND,
            "bin_sha256": digest.hexdigest(), "idx_sha256": sha256_file(megatron.idx_path(prefix)), "parts": parts}


# ---------------------------------------------------------------- verify

def _scan_bin(path: Path, dtype: np.dtype, count: int, starts: np.ndarray) -> tuple[int, int, int, int, np.ndarray]:
    """One sequential read of the ``.bin``: ``(min, max, offset of first min, offset of first
    max, tokens at starts)``, with ``starts`` ``int64[d]`` ascending token offsets (the
    documents' first tokens). Reads :data:`SCAN_CHUNK_TOKENS` tokens at a time into a fresh
    buffer (not a memory map, whose pages would stay resident): memory is one chunk,
    whatever the size of the dataset."""
    lo = hi = None
    lo_at = hi_at = 0
    firsts = np.empty(len(starts), dtype=np.int64)
    with open(path, "rb") as fh:
        for start in range(0, count, SCAN_CHUNK_TOKENS):
            chunk = np.fromfile(fh, dtype=dtype, count=min(SCAN_CHUNK_TOKENS, count - start))
            if lo is None or int(chunk.min()) < lo:
                lo_at = start + int(chunk.argmin())
                lo = int(chunk[lo_at - start])
            if hi is None or int(chunk.max()) > hi:
                hi_at = start + int(chunk.argmax())
                hi = int(chunk[hi_at - start])
            a, b = np.searchsorted(starts, [start, start + chunk.size])
            firsts[a:b] = chunk[starts[a:b] - start]
    return lo, hi, lo_at, hi_at, firsts


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
    ids (uint16 or int32 below); every id in ``[0, vocab_size)`` (one sequential read of
    the ``.bin`` in chunks, :func:`_scan_bin`); the tokenizer file's sha256 matches the sidecar; every document starts with BOS id 2; the
    documents parquet has one row per document and document zero, BOS stripped, decodes
    exactly to row 0; then the first 64 tokens of document zero are printed.

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
            elif (got := sha256_file(path)) != want:
                fail(path, f"sha256 {got} != sidecar {key} {want}: the bytes changed after they were written",
                     "sha256")
        if vocab_size is not None and vocab_size != sidecar["vocab_size"]:
            fail(s, f"vocab_size {sidecar['vocab_size']} != expected {vocab_size}", "sidecar")
        vocab_size = vocab_size if vocab_size is not None else sidecar["vocab_size"]
        if tokenizer_sha256 is not None and tokenizer_sha256 != sidecar["tokenizer_sha256"]:
            fail(s, f"made with tokenizer sha256 {sidecar['tokenizer_sha256']}, expected {tokenizer_sha256}",
                 "tokenizer-sha256")
    figures["vocab_size"] = vocab_size

    info: IndexInfo | None = None
    if present[x]:
        try:
            info = read_index(x)
        except IndexFormatError as e:
            fail(x, str(e).removeprefix(f"{x}: "), "index")
    if info is not None:
        figures.update(sequences=info.sequence_count, documents=info.document_count,
                       tokens=info.token_count, dtype=info.dtype.name)

    bin_ok = False
    if info is not None and present[b]:
        size = b.stat().st_size
        bin_ok = size == info.bin_bytes
        if not bin_ok:
            fail(b, f"{size} bytes != sum(sequence lengths) {info.token_count} x itemsize "
                    f"{info.dtype.itemsize} = {info.bin_bytes}", "bin-size")

    if info is not None and vocab_size is not None:
        allowed = ("int32",) if vocab_size >= UINT16_VOCAB_LIMIT else ("uint16", "int32")
        if info.dtype.name not in allowed:
            fail(x, f"dtype code {info.dtype_code}: {info.dtype.name} index cannot hold ids of a "
                    f"{vocab_size}-token vocabulary (allowed: {', '.join(allowed)})", "dtype")

    tokens, firsts = None, None
    if info is not None and bin_ok:
        cum = np.concatenate([[0], np.cumsum(info.sequence_lengths, dtype=np.int64)])
        starts = cum[info.document_indices[:-1]]
        sizes = cum[info.document_indices[1:]] - starts
        nonempty = sizes > 0
        firsts = np.full(info.document_count, -1, dtype=np.int64)
    if bin_ok and info.token_count:
        tokens = np.memmap(b, dtype=info.dtype, mode="r", shape=(info.token_count,))  # document zero only
        lo, hi, lo_at, hi_at, firsts[nonempty] = _scan_bin(b, info.dtype, info.token_count, starts[nonempty])
    if tokens is not None and vocab_size is not None:
        figures.update(min_token=lo, max_token=hi)
        ends = np.cumsum(info.sequence_lengths, dtype=np.int64)
        if lo < 0:
            fail(b, f"negative token id {lo} at token {lo_at} (sequence "
                    f"{int(np.searchsorted(ends, lo_at, side='right'))})", "token-range")
        if hi >= vocab_size:
            fail(b, f"token id {hi} >= vocab_size {vocab_size} at token {hi_at} (sequence "
                    f"{int(np.searchsorted(ends, hi_at, side='right'))})", "token-range")
    else:
        skip("token-range", "no readable tokens" if vocab_size is not None else "vocab_size unknown")

    tok_file = sidecar["tokenizer_path"] if sidecar else None
    tok_bytes = tok_digest = None
    if tok_file is None:
        skip("tokenizer-sha256", "no sidecar")
    elif not tok_file.is_file():
        fail(tok_file, "tokenizer file named by the sidecar is missing", "tokenizer-sha256")
    else:
        tok_bytes = tok_file.read_bytes()  # hashed, then parsed from these very bytes
        tok_digest = hashlib.sha256(tok_bytes).hexdigest()
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
    if doc0 is not None and sidecar is not None and tok_bytes is not None:
        given = tokenizer if tokenizer is not None and tokenizer_sha256 == tok_digest else None
        tok = _check_doc0(doc0, tok_file, tok_bytes, tok_digest, given, sidecar, info.document_count, fail)
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


def _tokenizer(tok_bytes: bytes, digest: str, given=None):
    """The tokenizer of the file bytes ``tok_bytes`` (sha256 ``digest``): ``given`` (parsed
    by the caller from bytes of that digest), else the one parsed here earlier from bytes
    of that digest, else parsed now and kept (only tokenizers parsed here are kept).
    Raises whatever ``tokenizers`` raises for bad bytes."""
    from tokenizers import Tokenizer

    if given is not None:
        return given
    tok = _verify_module._TOKENIZERS.get(digest)
    if tok is None:
        tok = Tokenizer.from_buffer(tok_bytes)
        if hasattr(tok, "encode_special_tokens"):
            tok.encode_special_tokens = True
        _verify_module._TOKENIZERS.clear()
        _verify_module._TOKENIZERS[digest] = tok
    return tok


def _check_doc0(doc0: np.ndarray, tok_file: Path, tok_bytes: bytes, digest: str, given, sidecar: dict, n_docs: int,
                fail: Callable[[Path, str, str], None]):
    """Decode document zero with the tokenizer of ``tok_file`` (its bytes ``tok_bytes``,
    sha256 ``digest``; :func:`_tokenizer`) and compare it exactly with row 0 of the
    documents parquet.

    Returns the loaded ``tokenizers.Tokenizer`` (or None when it cannot be loaded).
    """
    try:
        tok = _tokenizer(tok_bytes, digest, given)
    except Exception as e:  # the tokenizers library raises its own exception types
        fail(tok_file, f"cannot load tokenizer: {e}", "doc0-roundtrip")
        return None
    docs_file, col = sidecar["documents_path"], sidecar["document_text_column"]
    try:
        pf = pq.ParquetFile(docs_file)
    except (OSError, ValueError) as e:
        fail(docs_file, f"cannot open documents parquet: {e}", "doc0-roundtrip")
        return tok
    names = pf.schema_arrow.names
    missing = [c for c in (sidecar["document_key_column"], col) if c not in names]
    if missing:
        fail(docs_file, f"columns {missing} missing (has {names})", "doc0-roundtrip")
        return tok
    if pf.metadata.num_rows != n_docs:
        fail(docs_file, f"{pf.metadata.num_rows} rows != {n_docs} Megatron documents", "doc0-roundtrip")
    if pf.metadata.num_rows == 0:
        return tok
    source = next(pf.iter_batches(batch_size=1, columns=[col])).column(0)[0].as_py()
    ids = doc0[1:] if doc0.size and doc0[0] == BOS_ID else doc0
    decoded = tok.decode(ids.tolist(), skip_special_tokens=False)
    if decoded != source:
        at = next((i for i, (p, q) in enumerate(zip(decoded, source)) if p != q),
                  min(len(decoded), len(source)))
        fail(docs_file, f"row 0 differs from decoded document zero at char {at} of "
                        f"{len(source)}/{len(decoded)}: source {source[at:at + 40]!r} vs decoded "
                        f"{decoded[at:at + 40]!r}", "doc0-roundtrip")
    return tok


# ---------------------------------------------------------------- the stage

def _document_level(ctx, tok, info: dict, d, prefix, docs_out: ParquetStream) -> dict:
    """The document-level export of every ``tokenized`` shard but the chunk drops
    (:func:`megacpp_core.megatron_export.document_level`)."""
    order = {s.name: i for i, s in enumerate(ctx.sources)}
    return document_level(pack_inputs.tokenized_shards(ctx, info["sha256"]), pack_inputs.chunk_drops(ctx),
                                          order, ctx.settings, tok, info, d, prefix, docs_out)


def compute(ctx) -> Result:
    tok, info = snapshot_tokenizer.load(ctx)
    level = ctx.settings.megatron_export
    if level not in fmt.EXPORT_LEVELS:
        raise StageError(f"settings.megatron_export {level!r} not in {fmt.EXPORT_LEVELS}")
    packed = ctx.input("packed")
    sentinel = packed.sentinel()
    pack.check_tokenizer(sentinel, info["sha256"], info["vocab_size"], packed.uri)
    name = fmt.prefix_name(ctx.snapshot)
    d = ctx.workdir("megatron-")
    prefix = d / name
    docs_file = d / f"{name}.documents.parquet"
    docs_schema = pa.schema([("doc_key", pa.string()), ("text", pa.large_string())])
    with ParquetStream(docs_file, docs_schema) as docs_out:
        if level == "document":
            written = _document_level(ctx, tok, info, d, prefix, docs_out)
        else:
            written = fmt._row_level(tok, info, packed, sentinel, d, prefix, docs_out)
    tok_file = d / "tokenizer.json"
    tok_file.write_bytes(ctx.input("tokenizer").read_bytes())
    write_sidecar(prefix, vocab_size=info["vocab_size"], tokenizer_path=tok_file, tokenizer_sha256=info["sha256"],
                         documents_path=docs_file, extra={"export_level": level, "row_length": ctx.settings.row_length,
                                                          "bin_sha256": written["bin_sha256"],
                                                          "idx_sha256": written["idx_sha256"],
                                                          "documents_sha256": sha256_file(docs_file)})
    lines: list[str] = []
    report = verify_megatron(prefix, out=lines.append, tokenizer_sha256=info["sha256"], vocab_size=info["vocab_size"],
                                    tokenizer=tok)
    if not report.ok:
        raise StageError(f"verify gate failed for {name}: {'; '.join(report.failures)}")
    files = {p.name: p for p in d.iterdir() if p.is_file()}
    figures = {**written, "prefix": f"megatron/{name}", "export_level": level, "verify_ok": report.ok,
               "verify_failures": report.failures, "first_tokens": lines[-2:] if lines else [],
               "tokenizer_sha256": info["sha256"], "vocab_size": info["vocab_size"]}
    return Result({"megatron": Files(dict(files), order=(f"{name}.bin", f"{name}.idx", f"{name}.json"))}, figures)


def verify_gate(g):
    """SPEC §7 verify gate on the committed ``.bin/.idx`` (copied locally from an object
    store); document zero is decoded with the snapshot tokenizer the stage parsed when the
    committed ``tokenizer.json`` has its sha256."""
    f = g.figures
    name = f["prefix"].rsplit("/", 1)[-1]
    lines: list[str] = []
    with g.output("megatron").local() as d:
        report = verify_megatron(d / name, out=lines.append, tokenizer_sha256=f["tokenizer_sha256"],
                                        vocab_size=f["vocab_size"], require_checksums=True,
                                        tokenizer=gate_tokenizer(g.ctx, f["tokenizer_sha256"]))
    return report.ok, "; ".join(report.failures) or "verify passed"


def baseline_stage():
    """The format stage with the compute and gate above."""
    return dataclasses.replace(fmt.STAGE, compute=compute, gates=(verify_gate,))
