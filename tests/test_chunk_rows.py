"""The chunk stage's per-file work (``stages.chunk.chunk_rows``) against a plain reference.

``chunk_rows`` encodes whole files in a background thread and counts spans of files over
the budget from the file's one encoding (``span_count.SpanCounter``). Its documents must be
exactly those of splitting every file with a counter that encodes each span, and its
enrichment exactly ``enrich`` run on those documents.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megacpp_core import chunk, enrich, platforms
from megacpp_core import tokenizer as T
from megacpp_core.stages import chunk as stage

FIXTURES = Path(__file__).parent / "fixtures"


def _files() -> dict[str, list]:
    from tests.test_tokenizer import c_corpus

    texts = [(p.name, p.read_text(), "cpp" if p.suffix != ".c" else "c")
             for p in sorted(FIXTURES.rglob("*")) if p.suffix in (".c", ".cpp", ".hpp", ".h")]
    gen = c_corpus(60)
    texts += [(f"gen{i}.cpp", "".join(gen[i:i + 1 + i % 9]), "cpp") for i in range(0, 60, 3)]
    texts += [("empty.c", "", "c"), ("crlf.c", "int a;\r\nint f(void) {\r\n  return a;\r\n}\r\n" * 30, "c"),
              ("broken.cpp", "MACRO(x) { int a = 1;\n  if (a) { b(); }\n" * 40, "cpp"),
              ("unicode.cpp", "// ünïcödé ✓\nint ß(int a) { return a; }\n" * 50, "cpp"),
              ("long_line.c", "int x = " + " + ".join(["1"] * 3000) + ";\n", "c")]
    n = len(texts)
    return {"doc_key": [f"s/{k}" for k, _, _ in texts], "text": [t for _, t, _ in texts],
            "language": [lang for _, _, lang in texts], "source": ["s"] * n, "path": [k for k, _, _ in texts],
            "archive_sha256": ["r"] * n, "license_class": ["permissive"] * n}


@pytest.fixture(scope="module")
def tok():
    from tests.test_tokenizer import c_corpus

    return T.train_tokenizer(c_corpus(120), vocab_size=T.MIN_VOCAB_SIZE).tokenizer


@pytest.mark.parametrize("budget", [120, 700])
def test_chunk_rows_equal_a_plain_split(tok, budget, monkeypatch):
    monkeypatch.setattr(stage, "ENCODE_BATCH_CHARS", 3000)  # many batches, encoded ahead
    monkeypatch.setattr(stage, "ENCODE_BATCH_FILES", 4)
    d = _files()
    cols, tally = stage.chunk_rows(d, tok, "test-tokenizer", budget, True)
    assert tally["split_files"] >= 3 and tally["span_encoded_chars"] > 0
    count = lambda s: T.count_tokens(tok, s)  # noqa: E731
    k = 0
    for key, text, lang in zip(d["doc_key"], d["text"], d["language"]):
        chunks = chunk.split_document(text, lang, count, budget, key)
        fe = enrich.enrich_file(text, lang) if text else None
        for j, c in enumerate(chunks):
            assert (cols["doc_key"][k], cols["start"][k], cols["end"][k]) == (f"{key}#{j}", c.start, c.end)
            assert (cols["kind"][k], cols["name"][k], cols["n_text_tokens"][k]) == (c.kind, c.name, c.n_tokens)
            assert cols["n_text_tokens"][k] == count(text[c.start:c.end])
            de = enrich.document_enrichment(fe, c.start, c.end)
            assert cols["char_chunk_boundaries"][k] == de.chunks
            assert (cols["call_edges"][k], cols["type_edges"][k]) == (de.call_edges, de.type_edges)
            assert all(cols[f"char_{n}"][k] == p for n, p in de.planes.items())
            assert cols["platform_ids"][k] == platforms.scan_platforms(text[c.start:c.end])
            k += 1
    assert k == len(cols["doc_key"])


def test_encoding_errors_surface(tok, monkeypatch):
    d = _files()

    def boom(*a, **kw):
        raise RuntimeError("encoder failed")

    monkeypatch.setattr(stage._WholeCounts, "_encode", boom)
    with pytest.raises(RuntimeError, match="encoder failed"):
        stage.chunk_rows(d, tok, "test-tokenizer", 700, False)
