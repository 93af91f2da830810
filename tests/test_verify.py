"""The Megatron verify gate (SPEC §7): one passing dataset, then one test per failure."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megacpp_checks.verify import main_verify, verify_megatron, write_sidecar
from megacpp_core.megatron import write_indexed_dataset
from megacpp_core.tables import sha256_file, write_parquet

DECLARED_VOCAB = 131072
SOURCES = [
    "int main(void) {\n    return 0;\n}\n",
    "#include <stdio.h>\nint add(int a, int b) { return a + b; }\n",
    "template <typename T>\nT max_of(T a, T b) { return a < b ? b : a; }\n",
    "struct point { double x, y; };\n// <BOS> inside a comment stays text\n",
]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A throwaway byte-level BPE (vocab 300) whose <BOS> is id 2."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<PAD>", "<UNK>", "<BOS>", "<EOS>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(SOURCES * 20, trainer)
    assert tok.token_to_id("<BOS>") == 2
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def build(tmp_path, tokenizer_file, *, vocab_size=DECLARED_VOCAB, index_vocab=None,
          texts=None, tokenizer_sha=None, checksums=True) -> str:
    """Write a dataset of SOURCES under ``tmp_path/ds/train`` and return its prefix.

    ``index_vocab`` picks the index dtype (default: ``vocab_size``); ``texts`` overrides the
    parquet's source texts; ``tokenizer_sha`` overrides the sidecar's digest; ``checksums``
    records the payload sha256s in the sidecar, as the format stage does.
    """
    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.encode_special_tokens = True
    docs = [np.array([2, *tok.encode(t).ids], dtype=np.uint32) for t in SOURCES]
    prefix = tmp_path / "ds" / "train"
    written = write_indexed_dataset(prefix, docs, index_vocab or vocab_size)
    texts = texts or SOURCES
    docs_path = write_parquet(pa.table({"doc_key": [f"k{i}" for i in range(len(texts))], "text": texts}),
                              tmp_path / "ds" / "documents.parquet")
    extra = ({"bin_sha256": written["bin_sha256"], "idx_sha256": written["idx_sha256"],
              "documents_sha256": sha256_file(docs_path)} if checksums else None)
    write_sidecar(prefix, vocab_size=vocab_size, tokenizer_path=tokenizer_file,
                  tokenizer_sha256=tokenizer_sha or sha256_file(tokenizer_file), documents_path=docs_path, extra=extra)
    return str(prefix)


def run(path) -> tuple[int, str]:
    """(exit code, printed text) of the gate on ``path``."""
    lines: list[str] = []
    return main_verify(path, out=lines.append), "\n".join(lines)


def assert_fails(path, *needles: str) -> None:
    """The gate exits 1 on ``path`` and its output contains every needle."""
    code, text = run(path)
    assert code == 1, text
    for needle in needles:
        assert needle in text, text


def test_valid_dataset_passes(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file)
    for path in (prefix, prefix + ".bin", prefix + ".idx"):
        code, text = run(path)
        assert code == 0, text
    assert "OK" in text and "'<BOS>int main(void)" in text
    report = verify_megatron(prefix, out=lambda _: None)
    assert report.ok and report.failures == []
    assert report.figures["dtype"] == "int32"
    assert report.figures["documents"] == len(SOURCES)
    assert report.figures["first_tokens"][0] == 2
    assert report.figures["skipped"] == []
    # a sidecar written before payload checksums: the two checks are skipped and said so
    old = verify_megatron(build(tmp_path / "old", tokenizer_file, checksums=False), out=lambda _: None)
    assert old.ok and old.figures["skipped"] == ["bin_sha256", "idx_sha256", "documents_sha256"]
    strict = verify_megatron(build(tmp_path / "old2", tokenizer_file, checksums=False), out=lambda _: None,
                             require_checksums=True)  # the pipeline's own gate requires them
    assert not strict.ok and any("records no bin_sha256" in f for f in strict.failures)


def test_uint16_allowed_below_cutoff(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file, vocab_size=300)
    assert run(prefix)[0] == 0


def test_usage_error(tmp_path):
    assert run(tmp_path / "nothing")[0] == 2


@pytest.mark.parametrize("ext", [".idx", ".bin"])
def test_missing_file(tmp_path, tokenizer_file, ext):
    prefix = build(tmp_path, tokenizer_file)
    (tmp_path / "ds" / f"train{ext}").unlink()
    assert_fails(prefix, f"train{ext}: missing [present]")


def test_truncated_bin(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file)
    path = tmp_path / "ds" / "train.bin"
    path.write_bytes(path.read_bytes()[:-4])
    assert_fails(prefix, "train.bin:", "[bin-size]")


@pytest.mark.parametrize("offset,patch,needle", [
    (0, b"XXIDIDX\x00\x00", "bad magic"),
    (9, struct.pack("<Q", 2), "unsupported version 2"),
    (17, struct.pack("<B", 99), "unknown dtype code 99"),
])
def test_corrupted_index_header(tmp_path, tokenizer_file, offset, patch, needle):
    prefix = build(tmp_path, tokenizer_file)
    path = tmp_path / "ds" / "train.idx"
    raw = path.read_bytes()
    path.write_bytes(raw[:offset] + patch + raw[offset + len(patch):])
    assert_fails(prefix, "train.idx:", needle, "[index]")


def test_token_id_out_of_vocab(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file)
    path = tmp_path / "ds" / "train.bin"
    ids = np.fromfile(path, dtype=np.int32)
    ids[-1] = DECLARED_VOCAB + 5
    ids.tofile(path)
    assert_fails(prefix, f"token id {DECLARED_VOCAB + 5} >= vocab_size {DECLARED_VOCAB}", "[token-range]")


def test_uint16_index_at_large_vocab(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file, index_vocab=300)
    assert_fails(prefix, "train.idx:", "uint16 index cannot hold ids of a 131072-token vocabulary", "[dtype]")


def test_document_zero_mismatch(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file, texts=["int main(void) {\n    return 1;\n}\n", *SOURCES[1:]])
    assert_fails(prefix, "documents.parquet:", "row 0 differs from decoded document zero", "[doc0-roundtrip]")


def test_tokenizer_sha_mismatch(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file, tokenizer_sha="0" * 64)
    assert_fails(prefix, "tokenizer.json:", "!= sidecar " + "0" * 64, "[tokenizer-sha256]")


def test_missing_bos(tmp_path, tokenizer_file):
    prefix = build(tmp_path, tokenizer_file)
    path = tmp_path / "ds" / "train.bin"
    ids = np.fromfile(path, dtype=np.int32)
    ids[np.flatnonzero(ids == 2)[1]] = 3
    ids.tofile(path)
    assert_fails(prefix, "1 of 4 documents do not start with BOS id 2 (first: document 1", "[bos]")


def test_bin_scan_in_small_chunks_finds_the_same_failures(tmp_path, tokenizer_file, monkeypatch):
    """The .bin is scanned in chunks of SCAN_CHUNK_TOKENS (a sequential read, not a memory
    map): with 5-token chunks every document spans chunk boundaries, and the gate still
    passes the clean dataset and names the same document and token offsets."""
    from megacpp_checks import verify as v

    monkeypatch.setattr(v, "SCAN_CHUNK_TOKENS", 5)
    prefix = build(tmp_path, tokenizer_file, checksums=False)
    assert verify_megatron(prefix).ok
    path = tmp_path / "ds" / "train.bin"
    ids = np.fromfile(path, dtype=np.int32)
    bos = np.flatnonzero(ids == 2)
    ids[bos[3]] = 7  # document 3 no longer starts with BOS
    ids[bos[2] + 3] = DECLARED_VOCAB + 9  # an out-of-range id inside document 2
    ids.tofile(path)
    report = verify_megatron(prefix)
    text = "\n".join(report.failures)
    assert "1 of 4 documents do not start with BOS id 2 (first: document 3, starts with 7)" in text, text
    assert f"token id {DECLARED_VOCAB + 9} >= vocab_size {DECLARED_VOCAB} at token {bos[2] + 3} (sequence 2)" in text, text
    monkeypatch.setattr(v, "SCAN_CHUNK_TOKENS", 1 << 24)
    assert verify_megatron(prefix).failures == report.failures


class _WrongTokenizer:
    """Decodes every id sequence to the same text."""

    def decode(self, ids, skip_special_tokens=False):
        return "not the source"


def test_doc0_decoded_with_the_given_tokenizer_only_at_its_sha256(tmp_path, tokenizer_file):
    """A tokenizer handed in by the producing stage decodes document zero when the
    sidecar's tokenizer file has the sha256 it is given with (a wrong one is caught);
    without that sha256, or at another one, the gate parses the file itself."""
    prefix = build(tmp_path, tokenizer_file)
    sha = sha256_file(tokenizer_file)
    report = verify_megatron(prefix, out=lambda _: None, tokenizer_sha256=sha, tokenizer=_WrongTokenizer())
    assert not report.ok and any("row 0 differs from decoded document zero" in f for f in report.failures)
    assert verify_megatron(prefix, out=lambda _: None, tokenizer=_WrongTokenizer()).ok
    other = verify_megatron(prefix, out=lambda _: None, tokenizer_sha256="0" * 64, tokenizer=_WrongTokenizer())
    assert [f.rsplit("[", 1)[1] for f in other.failures] == ["tokenizer-sha256]"]


def test_gate_parses_a_tokenizer_once_per_file_bytes(tmp_path, tokenizer_file, monkeypatch):
    """The gate keeps the tokenizer it parsed by the sha256 of the file bytes: the next
    call on the same bytes decodes with it, other bytes are parsed anew."""
    from megacpp_checks import verify as v

    monkeypatch.setattr(v, "_TOKENIZERS", {})
    prefix = build(tmp_path, tokenizer_file)
    sha = sha256_file(tokenizer_file)
    assert verify_megatron(prefix, out=lambda _: None).ok and list(v._TOKENIZERS) == [sha]
    v._TOKENIZERS[sha] = _WrongTokenizer()  # what the next call on those bytes decodes with
    assert any("row 0 differs" in f for f in verify_megatron(prefix, out=lambda _: None).failures)
    copy = tmp_path / "tok2" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(tokenizer_file.read_bytes() + b"\n")
    assert verify_megatron(build(tmp_path / "other", copy), out=lambda _: None).ok
    assert list(v._TOKENIZERS) == [sha256_file(copy)]


def _rewrite_sidecar(prefix: str, **changes) -> None:
    import json

    path = f"{prefix}.json"
    with open(path) as f:
        doc = json.load(f)
    doc.update(changes)
    with open(path, "w") as f:
        json.dump(doc, f)


def _document_start(prefix: str, doc: int) -> tuple[np.ndarray, int]:
    """``(the .bin's ids, token offset of document doc)``."""
    from megacpp_core.megatron import read_index

    info = read_index(f"{prefix}.idx")
    return np.fromfile(f"{prefix}.bin", dtype=info.dtype), int(info.sequence_lengths[:doc].sum(dtype=np.int64))


def _flip_token(prefix: str, doc: int, new_id: int, at: int = 1) -> None:
    """Token ``at`` of document ``doc`` becomes ``new_id`` (the index is unchanged)."""
    ids, start = _document_start(prefix, doc)
    ids[start + at] = new_id
    ids.tofile(f"{prefix}.bin")


def _swap_documents(prefix: str) -> None:
    """Documents 1 and 2 swap lengths in the index (pointers kept consistent, so the index
    still parses)."""
    from megacpp_core.megatron import read_index

    info = read_index(f"{prefix}.idx")
    lengths = info.sequence_lengths.copy()
    lengths[[1, 2]] = lengths[[2, 1]]
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * info.dtype.itemsize)])
    raw = open(f"{prefix}.idx", "rb").read()
    head = 34  # magic, version, dtype code, sequence and document counts
    out = raw[:head] + lengths.astype("<i4").tobytes() + pointers.astype("<i8").tobytes() + raw[head + lengths.size * 12:]
    assert len(out) == len(raw) and struct.unpack("<Q", raw[18:26])[0] == lengths.size
    open(f"{prefix}.idx", "wb").write(out)


def _docs_row(tmp_path, row: int, text: str) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "ds" / "documents.parquet"
    t = pq.read_table(path)
    texts = t.column("text").to_pylist()
    texts[row] = text
    write_parquet(pa.table({"doc_key": t.column("doc_key"), "text": texts}), path)


#: One corruption per check of the gate (SPEC §7): ``(id, corrupt(tmp_path, prefix, tokenizer_file),
#: verify kwargs, the rule tag, a needle of its message)``. Each is caught by its own check, so
#: dropping or weakening any check of ``verify_megatron`` fails its case here.
EVERY_CHECK = [
    ("bin-missing", lambda t, p, tf: (t / "ds" / "train.bin").unlink(), {}, "present", "train.bin: missing"),
    ("idx-empty", lambda t, p, tf: (t / "ds" / "train.idx").write_bytes(b""), {}, "present", "train.idx: empty"),
    ("sidecar-missing", lambda t, p, tf: (t / "ds" / "train.json").unlink(), {}, "present", "train.json: missing"),
    ("sidecar-unreadable", lambda t, p, tf: (t / "ds" / "train.json").write_text("{not json"), {}, "sidecar",
     "unreadable sidecar"),
    ("sidecar-fields", lambda t, p, tf: _rewrite_sidecar(p, vocab_size="many"), {}, "sidecar", "missing or mistyped"),
    ("vocab-expected", lambda t, p, tf: None, {"vocab_size": 4096}, "sidecar", "!= expected 4096"),
    ("bin-sha256-in-range", lambda t, p, tf: _flip_token(p, 3, 77), {}, "sha256", "train.bin: sha256"),
    ("idx-sha256", lambda t, p, tf: _swap_documents(p), {}, "sha256", "train.idx: sha256"),
    ("documents-sha256", lambda t, p, tf: _docs_row(t, 2, "changed row"), {}, "sha256", "documents.parquet: sha256"),
    ("checksums-required", lambda t, p, tf: _rewrite_sidecar(p, bin_sha256=None), {"require_checksums": True},
     "sha256", "records no bin_sha256"),
    ("tokenizer-expected", lambda t, p, tf: None, {"tokenizer_sha256": "0" * 64}, "tokenizer-sha256",
     "expected " + "0" * 64),
    ("index", lambda t, p, tf: (t / "ds" / "train.idx").write_bytes(b"XX" + (t / "ds" / "train.idx").read_bytes()[2:]),
     {}, "index", "bad magic"),
    ("bin-size", lambda t, p, tf: (t / "ds" / "train.bin").write_bytes((t / "ds" / "train.bin").read_bytes() + b"\0" * 4),
     {}, "bin-size", "bytes != sum(sequence lengths)"),
    ("dtype", None, {}, "dtype", "uint16 index cannot hold"),
    ("token-range-high", lambda t, p, tf: _flip_token(p, 2, DECLARED_VOCAB), {}, "token-range",
     f"token id {DECLARED_VOCAB} >= vocab_size"),
    ("token-range-negative", lambda t, p, tf: _flip_token(p, 1, -3), {}, "token-range", "negative token id -3"),
    ("tokenizer-sha256", lambda t, p, tf: _rewrite_sidecar(p, tokenizer_sha256="f" * 64), {}, "tokenizer-sha256",
     "!= sidecar " + "f" * 64),
    ("tokenizer-missing", lambda t, p, tf: _rewrite_sidecar(p, tokenizer_path="nowhere/tokenizer.json"), {},
     "tokenizer-sha256", "tokenizer file named by the sidecar is missing"),
    ("bos", lambda t, p, tf: _flip_token(p, 2, 5, at=0), {}, "bos",
     "do not start with BOS id 2 (first: document 2, starts with 5)"),
    ("doc0-text", lambda t, p, tf: _docs_row(t, 0, "int main(void) { return 7; }\n"), {}, "doc0-roundtrip",
     "row 0 differs from decoded document zero"),
    ("doc0-rows", lambda t, p, tf: write_parquet(pa.table({"doc_key": ["k0"], "text": [SOURCES[0]]}),
                                                 t / "ds" / "documents.parquet"), {}, "doc0-roundtrip",
     "1 rows != 4 Megatron documents"),
    ("doc0-columns", lambda t, p, tf: write_parquet(pa.table({"doc_key": [f"k{i}" for i in range(4)], "body": SOURCES}),
                                                    t / "ds" / "documents.parquet"), {}, "doc0-roundtrip",
     "columns ['text'] missing"),
    ("doc0-parquet", lambda t, p, tf: (t / "ds" / "documents.parquet").write_bytes(b"not parquet"), {},
     "doc0-roundtrip", "cannot open documents parquet"),
]


@pytest.mark.parametrize("case", EVERY_CHECK, ids=[c[0] for c in EVERY_CHECK])
def test_every_check_of_the_gate_catches_its_corruption(tmp_path, tokenizer_file, case):
    """Each check of SPEC §7's gate, on a dataset that passes every other: the gate fails
    with that check's rule and message (a check that is dropped, or that no longer reads
    what it checks — the .bin's bytes, the index, the documents' row 0, the tokenizer
    file — leaves its case passing). The payload checksums are on, as in the pipeline."""
    name, corrupt, kwargs, rule, needle = case
    prefix = build(tmp_path, tokenizer_file, index_vocab=300 if name == "dtype" else None)
    assert name == "dtype" or verify_megatron(prefix, out=lambda _: None, require_checksums=True).ok
    if corrupt is not None:
        corrupt(tmp_path, prefix, tokenizer_file)  # the sidecar's checksums still describe the files as built
    lines: list[str] = []
    report = verify_megatron(prefix, out=lines.append, **kwargs)
    assert not report.ok, lines
    hits = [f for f in report.failures if f.endswith(f"[{rule}]") and needle in f]
    assert hits, (rule, needle, report.failures)
