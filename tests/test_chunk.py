"""Tests for stage 6 chunking (megacpp_core.chunk)."""

from __future__ import annotations

import re

import pytest

from megacpp_core.chunk import (
    Chunk,
    ChunkingError,
    StructureCategory,
    split_document,
    split_document_with_stats,
)

_TOK = re.compile(r"\w+|\S")


def count(s: str) -> int:
    """Deterministic stand-in tokenizer: words and single punctuation characters."""
    return len(_TOK.findall(s))


def check(text: str, chunks: list[Chunk], counter, budget: int) -> list[str]:
    """Assert the output contract independently of the module; return the chunk texts."""
    assert (chunks == []) == (text == "")
    pos = 0
    for c in chunks:
        assert c.start == pos < c.end
        assert c.n_tokens == counter(text[c.start : c.end]) <= budget
        assert c.kind in StructureCategory.__members__
        pos = c.end
    assert pos == len(text)
    texts = [text[c.start : c.end] for c in chunks]
    assert "".join(texts) == text
    return texts


def func(i: int, n_stmts: int = 3) -> str:
    body = "".join(f"    total += v{j} * {i};\n" for j in range(n_stmts))
    return f"// helper {i}\nint f{i}(int v0, int v1, int v2) {{\n    int total = 0;\n{body}    return total;\n}}\n"


def big_file() -> str:
    parts = ["#include <vector>\n#include <string>\n\n"]
    for i in range(12):
        parts.append(func(i) + "\n")
        if i % 3 == 0:
            parts.append(f"class C{i} {{\n public:\n  int x{i};\n  int get() const {{ return x{i}; }}\n}};\n\n")
        if i % 4 == 0:
            parts.append(f"namespace ns{i} {{\nint g{i}() {{ return {i}; }}\n}}  // namespace ns{i}\n\n")
    return "".join(parts)


UNIT_STARTS = ("// helper", "int f", "class C", "namespace ns")


def test_empty_and_whitespace():
    assert split_document("", "cpp", count, 10) == []
    chunks, stats = split_document_with_stats("", "c", count, 10)
    assert chunks == [] and stats == {"parse_errors": False, "brace_fallback": False, "units": 0, "fallback_splits": 0}
    text = "  \n\n\t\n"
    check(text, split_document(text, "cpp", count, 1), count, 1)


@pytest.mark.parametrize("budget", [1, 7, 40, 200, 100_000])
def test_invariants_hold_for_any_budget(budget):
    text = big_file()
    chunks = split_document(text, "cpp", count, budget, doc_key="big.cpp")
    check(text, chunks, count, budget)
    if budget == 100_000:
        assert len(chunks) == 1 and chunks[0].kind == "OTHER"


def test_splits_at_unit_boundaries():
    text = big_file()
    budget = 150
    assert count(text) > 4 * budget and max(count(func(i)) for i in range(12)) < budget
    chunks, stats = split_document_with_stats(text, "cpp", count, budget)
    texts = check(text, chunks, count, budget)
    assert len(chunks) > 4 and not stats["parse_errors"] and stats["fallback_splits"] == 0
    for c, t in zip(chunks[1:], texts[1:]):
        assert text[c.start - 1] == "\n"
        assert t.lstrip().startswith(UNIT_STARTS), t[:40]
    # every function start is inside a chunk that also holds its whole definition
    for i in range(12):
        head = text.index(f"int f{i}(")
        c = next(c for c in chunks if c.start <= head < c.end)
        assert text.index("\n}\n", head) + 3 <= c.end


def test_single_unit_kinds_and_names():
    cases = [
        ("c", "/* adds */\nint add(int a, int b) { return a + b; }\n", "FUNC_BODY", "add"),
        ("cpp", "template <class T>\nT twice(T x) { return x + x; }\n", "FUNC_BODY", "twice"),
        ("cpp", "int Foo::bar() const { return 1; }\n", "FUNC_BODY", "Foo::bar"),
        ("cpp", "class Foo {\n public:\n  int x;\n};\n", "CLASS_DECL", "Foo"),
        ("c", "struct point { int x, y; };\n", "CLASS_DECL", "point"),
        ("cpp", "namespace ns {\nint g() { return 0; }\n}\n", "NAMESPACE", "ns"),
        ("c", "typedef struct { int x; } point_t;\n", "TYPEDEF", "point_t"),
        ("cpp", "using index_t = long;\n", "TYPEDEF", "index_t"),
        ("c", "#include <stdio.h>\n", "PREAMBLE", None),
        ("c", "// just a comment\n", "COMMENT", None),
        ("c", "#include <stdio.h>\nint x;\n", "OTHER", None),
    ]
    for lang, text, kind, name in cases:
        (chunk,) = split_document(text, lang, count, 1000)
        assert (chunk.kind, chunk.name) == (kind, name), text
        assert StructureCategory[chunk.kind] == getattr(StructureCategory, kind)


def test_single_function_chunks_get_function_kind():
    text = "".join(func(i) + "\n" for i in range(6))
    budget = count(func(0)) + 5  # one function per chunk
    chunks = split_document(text, "c", count, budget)
    check(text, chunks, count, budget)
    assert [(c.kind, c.name) for c in chunks] == [("FUNC_BODY", f"f{i}") for i in range(6)]


def test_huge_function_is_split_at_statements():
    text = "#include <x.h>\n" + func(0) + func(1, n_stmts=400) + func(2)
    budget = 60
    chunks, stats = split_document_with_stats(text, "c", count, budget)
    texts = check(text, chunks, count, budget)
    assert len(chunks) > 20 and stats["fallback_splits"] == 0
    assert all(text[c.start - 1] == "\n" for c in chunks[1:])  # statement (line) boundaries
    # the oversized function starts a fresh chunk; the small ones are whole chunks
    assert any(t.startswith("// helper 1\nint f1(") for t in texts)
    assert texts[0] == "#include <x.h>\n" + func(0)
    assert (chunks[-1].kind, chunks[-1].name) == ("FUNC_BODY", "f2")


def test_giant_line_split_by_characters():
    text = "/* " + "lorem ipsum, dolor; " * 10_000 + "*/"
    assert len(text) > 200_000 and "\n" not in text
    budget = 1023
    chunks, stats = split_document_with_stats(text, "cpp", count, budget)
    check(text, chunks, count, budget)
    assert stats["fallback_splits"] >= 1 and len(chunks) >= count(text) // budget
    assert all(c.n_tokens >= budget - 2 for c in chunks[:-1])  # cuts are near-maximal


def test_non_ascii_offsets():
    text = (
        "// 日本語のコメント：関数の説明です。\n"
        "int f(void) { return 1; }  // 終わり 🎉\n"
        'const char *s = "Grüße, мир, 世界";\n'
        "/* ünïcödé\u3000ブロック */\n"
        "int g(int x) {\n    // ループ\n    return x * 2;\n}\n"
    ) * 5
    budget = 20
    chunks = split_document(text, "cpp", count, budget)
    texts = check(text, chunks, count, budget)
    # Same structure with every non-ASCII character replaced by an ASCII one of the same
    # regex class: the character offsets must be identical.
    ascii_text = "".join(
        c if c.isascii() else ("a" if re.match(r"\w", c) else " " if c.isspace() else "#") for c in text
    )
    ascii_chunks = split_document(ascii_text, "cpp", count, budget)
    assert [(c.start, c.end, c.kind, c.name) for c in ascii_chunks] == [
        (c.start, c.end, c.kind, c.name) for c in chunks
    ]
    assert ("FUNC_BODY", "f") in [(c.kind, c.name) for c in chunks]
    assert any(t.startswith("// 日本語") for t in texts)


def test_grammar_choice():
    cpp = "namespace ns {\nclass A { public: int f() { return 1; } };\n}\n"
    c_only = "int template = 3;\nint operator = 1;\n"  # keywords only in C++
    assert split_document_with_stats(cpp, "cpp", count, 1000)[1]["parse_errors"] is False
    for lang in ("header", "cuda"):
        (chunk,), stats = split_document_with_stats(cpp, lang, count, 1000)
        assert chunk.kind == "NAMESPACE" and not stats["parse_errors"]
    (chunk,), stats = split_document_with_stats(cpp, "c", count, 1000)
    assert stats["parse_errors"] and chunk.kind != "NAMESPACE"
    assert not split_document_with_stats(c_only, "c", count, 1000)[1]["parse_errors"]
    assert split_document_with_stats(c_only, "cpp", count, 1000)[1]["parse_errors"]
    with pytest.raises(ValueError):
        split_document(cpp, "rust", count, 1000)
    with pytest.raises(ValueError):
        split_document(cpp, "cpp", count, 0)


def test_syntax_errors_still_cover():
    text = ("int f( { return 1; }\n}}}\n@@ $$ ``\nint g() { return 2; }\n#if\nclass { ;\n" + func(3)) * 20
    for budget in (1, 9, 50):
        chunks, stats = split_document_with_stats(text, "cpp", count, budget)
        check(text, chunks, count, budget)
        assert stats["parse_errors"]


def test_budget_one_token():
    text = "namespace n {\nint f(int a) { return a + 1; }  // ok\n}\n"
    chunks = split_document(text, "cpp", count, 1)
    check(text, chunks, count, 1)
    assert len(chunks) == count(text)


def test_back_off_with_super_additive_counter():
    # floor(len / 40) is super-additive, so per-unit estimates undercount joined chunks.
    def counter(s: str) -> int:
        return count(s) + len(s) // 40

    text = big_file()
    for budget in (20, 64, 300):
        check(text, split_document(text, "cpp", counter, budget), counter, budget)


def test_unsplittable_character_raises():
    with pytest.raises(ChunkingError, match="^doc-7: "):
        split_document("int x;\n", "c", lambda s: 2 * len(s), 1, doc_key="doc-7")


def test_deterministic():
    text = big_file()
    assert split_document(text, "cpp", count, 33) == split_document(text, "cpp", count, 33)


def test_real_byte_level_bpe():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    corpus = [big_file(), func(7, 20), "// コメント\nint 関数() { return 0; }\n"] * 3
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer=trainer)

    def bpe_count(s: str) -> int:
        return len(tok.encode(s, add_special_tokens=False).ids)

    text = big_file() + "// 日本語のコメント\nint g(void) { return 0; }  // 🎉\n" + func(99, 300)
    for budget in (4, 64, 512, 4096):  # 4 = UTF-8 bytes of the widest character
        chunks = split_document(text, "cpp", bpe_count, budget, doc_key="bpe.cpp")
        check(text, chunks, bpe_count, budget)
    assert len(split_document(text, "cpp", bpe_count, 10**6)) == 1


def test_deep_expression_chain_falls_back_to_lines():
    # A 20k-deep left-recursive expression: syntactic descent stops at MAX_SPLIT_DEPTH.
    text = "int x = " + "1+\n" * 20_000 + "1;\n"
    chunks, stats = split_document_with_stats(text, "c", count, 255)
    check(text, chunks, count, 255)
    assert stats["fallback_splits"] >= 1 and not stats["parse_errors"]


def test_nested_headers_stay_with_their_first_member():
    text = "#include <a.h>\nnamespace outer {\nnamespace inner {\n\n" + "".join(func(i) for i in range(8)) + "}\n}\n"
    budget = 100
    texts = check(text, split_document(text, "cpp", count, budget), count, budget)
    assert texts[0] == "#include <a.h>\n"  # the oversized namespace starts a chunk
    assert texts[1].startswith("namespace outer {\nnamespace inner {\n\n// helper 0\nint f0(")
    assert all(t.lstrip().startswith("// helper") for t in texts[2:])


def test_data_arrays_cut_at_line_ends():
    rows = "".join("    " + ", ".join(str(r * 10 + c) for c in range(10)) + ",\n" for r in range(200))
    text = "static const int table[] = {\n" + rows + "};\n"
    budget = 100
    chunks = split_document(text, "c", count, budget)
    check(text, chunks, count, budget)
    assert len(chunks) > 10 and all(text[c.start - 1] == "\n" for c in chunks[1:])


# ----------------------------------------------------------------------------- brace fallback, buckets

from megacpp_core.chunk import BUCKETS, brace_cuts, bucket_for, parse_source  # noqa: E402

MACRO_FILE = (
    "#include <x.h>\n"
    "EXPORT_BEGIN(ns)\n"  # an unexpanded macro: tree-sitter makes ERROR nodes around it
    "API int f(int a) { const char* s = \"{{\"; char c = '}'; /* } */ return a; }\n"
    "API int g(int b) {\n  if (b) {\n    return 1;\n  }\n  return 2;\n}\n"
    "struct S { int x; };\n"
    "EXPORT_END(ns)\n"
)


def test_brace_cuts_skip_literals_and_comments():
    text = MACRO_FILE
    cuts = brace_cuts(text, 0, len(text))
    lines = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert lines[0] == "#include <x.h>\n"
    assert any(x.startswith("EXPORT_BEGIN(ns)\nAPI int f") and x.endswith("return a; }\n") for x in lines)
    assert any(x.startswith("API int g") and x.endswith("return 2;\n}\n") for x in lines)
    assert "struct S { int x; };\n" in lines
    raw = 'auto s = R"x(} ; {)x";\nint z;\n'
    assert brace_cuts(raw, 0, len(raw)) == [raw.index("int z")]
    assert brace_cuts("}}} int a;\nint b;\n", 0, 17) == [11]  # unmatched closers clamp at depth 0


def test_error_files_use_the_brace_splitter():
    parsed = parse_source(MACRO_FILE, "cpp")
    assert parsed.has_error_nodes
    chunks, stats = split_document_with_stats(MACRO_FILE, "cpp", count, 40, "m.cpp", parsed)
    check(MACRO_FILE, chunks, count, 40)
    assert stats["brace_fallback"] and all(c.kind == "OTHER" for c in chunks)
    ends = {c.end for c in chunks}
    assert MACRO_FILE.index("API int g") in ends  # a depth-0 boundary
    clean, stats = split_document_with_stats("int f() { return 1; }\n", "cpp", count, 40)
    assert not stats["brace_fallback"]
    missing_only = parse_source("int f() { return 1 }\n", "cpp")  # a MISSING ';', no ERROR node
    assert missing_only.tree.root_node.has_error and not missing_only.has_error_nodes


def brace_split(text: str, budget: int):
    """Split a file that has ERROR nodes; the chunks must satisfy :func:`check`."""
    assert parse_source(text, "cpp").has_error_nodes
    chunks, stats = split_document_with_stats(text, "cpp", count, budget, "brace.cpp")
    check(text, chunks, count, budget)
    assert stats["brace_fallback"]
    return chunks, stats


def test_oversized_brace_unit_splits_at_statements():
    body = "".join(f"  x += {i};\n" for i in range(40))
    text = "MACRO(a)\nint f(int x) {\n" + body + "  return x;\n}\n"
    chunks, _ = brace_split(text, 30)
    assert len(chunks) > 2
    for c in chunks[1:-1]:  # inner cuts fall after whole statements
        assert text[c.end - 2:c.end] == ";\n"


def test_buckets():
    assert BUCKETS == (4096, 8192, 16384, 65536, 131072)
    assert bucket_for(1) == 4096 and bucket_for(4096) == 4096 and bucket_for(4097) == 8192
    assert bucket_for(16385) == 65536 and bucket_for(131072) == 131072
    with pytest.raises(ValueError):
        bucket_for(131073)


def test_brace_splitter_recurses_below_the_first_level():
    inner = "".join(f"      y += {i};\n" for i in range(30))
    text = "MACRO(a)\nint f(int x) {\n  int y = 0;\n  while (x--) {\n" + inner + "  }\n  return y;\n}\n"
    chunks, stats = brace_split(text, 60)
    assert stats["fallback_splits"] == 0  # statements, never bare lines
    for c in chunks[:-1]:
        assert text[c.end - 2:c.end] in (";\n", "{\n", "}\n", ")\n")
