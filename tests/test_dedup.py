"""Stage 4 dedup: exact + MinHash-LSH near dedup, keep policy, determinism, figures."""

from __future__ import annotations

import random

import pytest

from megacpp_core.dedup import DedupRecord, deduplicate, minhash_signature, shingles


def synthetic_c(seed: int, n_funcs: int = 24) -> str:
    """~3 KB of C-like source whose identifiers and constants depend on ``seed``."""
    rng = random.Random(seed)
    words = ["buf", "len", "idx", "state", "ctx", "hash", "seed", "acc", "lane", "block", "tail", "mask"]
    lines = [f"/* module {seed} */", "#include <stdint.h>", ""]
    for f in range(n_funcs):
        a, b, c = rng.sample(words, 3)
        k = rng.randrange(1 << 30)
        lines += [
            f"static uint32_t {a}_{b}_{seed}_{f}(uint32_t {a}, uint32_t {c}) {{",
            f"    return ({a} ^ {k}u) + ({c} << {f % 31}) - {b[0]}_{f};",
            "}",
        ]
    return "\n".join(lines) + "\n"


def rec(doc_key, text, source="s", source_order=0, path=None, license_class="permissive"):
    return DedupRecord(doc_key, source, source_order, path or doc_key, license_class, text)


def by_key(result):
    return {d["doc_key"]: d for d in result.decisions}


def check_figures(result):
    f = result.figures
    assert f["files_in"] == f["files_out"] + f["exact_removed"] + f["near_removed"] + f["cross_source_removed"]
    assert f["files_in"] == len(result.decisions)
    assert f["files_out"] == sum(d["keep"] for d in result.decisions)
    assert f["lsh_bands"] * f["lsh_rows"] <= f["num_perm"]
    kept = {d["doc_key"] for d in result.decisions if d["keep"]}
    for d in result.decisions:
        assert (d["kept_twin"] is None) == d["keep"]
        assert d["kept_twin"] is None or d["kept_twin"] in kept  # every drop names a kept twin


def test_shingles_tokenizer_and_short_docs():
    assert list(shingles("a+b;  c\n d_1(e) f", k=5)) == [b"a b c d_1 e", b"b c d_1 e f"]
    assert list(shingles("int x;", k=5)) == [b"int x"]
    assert list(shingles("  /* */ ;;", k=5)) == []
    assert list(shingles("", k=5)) == []
    with pytest.raises(ValueError):
        list(shingles("a", k=0))
    assert minhash_signature("").is_empty()


def test_exact_keep_policy_license_then_source_then_path():
    t = synthetic_c(1)
    recs = [
        rec("z/gpl.c", t, "z", 0, "a.c", "gpl2"),
        rec("y/late.c", t, "y", 5, "a.c"),
        rec("x/b.c", t, "x", 2, "b.c"),
        rec("x/a.c", t, "x", 2, "a.c"),
        rec("w/other.c", synthetic_c(2), "w", 0),
    ]
    res = deduplicate(recs)
    d = by_key(res)
    assert d["x/a.c"]["keep"] and d["w/other.c"]["keep"]
    for k in ("z/gpl.c", "y/late.c", "x/b.c"):
        assert d[k] | {"keep": False, "dup_kind": "exact", "kept_twin": "x/a.c", "jaccard": 1.0} == d[k]
    assert d["x/a.c"]["cluster_id"] == d["x/b.c"]["cluster_id"] >= 0
    assert d["w/other.c"]["cluster_id"] == -1
    assert res.figures["exact_removed"] == 3 and res.figures["near_removed"] == 0
    assert res.figures["clusters"] == 1
    check_figures(res)

    # License rank beats source order: the gpl2 copy loses even from source 0.
    res2 = deduplicate([rec("a/x.c", t, "a", 0, "x.c", "gpl2"), rec("b/x.c", t, "b", 9, "x.c", "weak_copyleft")])
    assert by_key(res2)["a/x.c"]["kept_twin"] == "b/x.c"


def test_near_duplicate_found_and_unrelated_not_merged():
    base = synthetic_c(3)
    assert 2500 < len(base.encode()) < 4000
    lines = base.splitlines()
    for i in (10, 30, 50):
        lines[i] = "    return 0; /* patched */"
    edited = "\n".join(lines) + "\n"
    recs = [rec("b/lib.c", edited, "b", 1), rec("a/lib.c", base, "a", 0), rec("c/other.c", synthetic_c(4), "c", 2)]
    res = deduplicate(recs)
    d = by_key(res)
    assert d["a/lib.c"]["keep"] and d["c/other.c"]["keep"]
    near = d["b/lib.c"]
    # Different sources: the cross-source pass (14 x 8 bands, union-find) removes it.
    assert near["dup_kind"] == "cross_source" and near["kept_twin"] == "a/lib.c" and near["jaccard"] >= 0.7
    assert near["cluster_id"] == d["a/lib.c"]["cluster_id"] >= 0 and d["c/other.c"]["cluster_id"] == -1
    assert res.figures["cross_source_removed"] == 1 and res.figures["clusters"] == 1
    rows = [c for c in res.clusters if c["cluster_id"] == near["cluster_id"]]
    assert [(c["doc_key"], c["is_kept"], c["kept_doc_key"]) for c in rows] == [
        ("a/lib.c", True, "a/lib.c"), ("b/lib.c", False, "a/lib.c")]
    assert rows[1]["jaccard_to_kept"] == near["jaccard"]
    # The same pair within one source is a near (within-corpus) drop.
    same = by_key(deduplicate([rec("a/lib.c", base, "a", 0), rec("a/lib2.c", edited, "a", 0, "lib2.c")]))
    assert same["a/lib2.c"]["dup_kind"] == "near" and same["a/lib2.c"]["kept_twin"] == "a/lib.c"
    assert res.figures["lsh_bands"] > 0 and 0 < res.figures["effective_threshold"] < 1
    check_figures(res)


def test_chain_drops_only_within_threshold_of_a_kept_file():
    # Sliding windows of 9 out of 11 blocks: A~B and B~C (J ~ 0.8), but A !~ C (J ~ 0.64).
    parts = [synthetic_c(10 + i, n_funcs=4) for i in range(11)]
    a, b, c = "".join(parts[0:9]), "".join(parts[1:10]), "".join(parts[2:11])
    ja = minhash_signature(a).jaccard(minhash_signature(c))
    assert ja < 0.7
    recs = [rec("a.c", a, source_order=0), rec("b.c", b, source_order=1), rec("c.c", c, source_order=2)]
    d = by_key(res := deduplicate(recs))
    # B is dropped for A; C is only near B (already dropped), and too far from A: kept.
    assert d["a.c"]["keep"] and not d["b.c"]["keep"] and d["c.c"]["keep"]
    assert d["b.c"]["kept_twin"] == "a.c" and d["b.c"]["jaccard"] >= 0.7
    assert d["a.c"]["cluster_id"] == d["b.c"]["cluster_id"] != d["c.c"]["cluster_id"] == -1
    assert res.figures["clusters"] == 1
    check_figures(res)


def test_exact_copy_of_near_drop_names_the_kept_record():
    base = synthetic_c(5)
    edited = base.replace("module 5", "module five").replace("<stdint.h>", "<stddef.h>")
    recs = [rec("a.c", base, source_order=0), rec("b.c", edited, source_order=1), rec("c.c", edited, source_order=2)]
    d = by_key(res := deduplicate(recs))
    assert d["b.c"]["dup_kind"] == "near" and d["c.c"]["dup_kind"] == "exact"
    assert d["b.c"]["kept_twin"] == d["c.c"]["kept_twin"] == "a.c"
    assert d["c.c"]["jaccard"] == d["b.c"]["jaccard"]
    check_figures(res)


def test_empty_and_short_docs():
    recs = [
        rec("e1", ""),
        rec("e2", ""),
        rec("p1", "/* */\n"),
        rec("s1", "int x;"),
        rec("s2", "int  x ;"),
        rec("s3", "long y;"),
    ]
    d = by_key(res := deduplicate(recs))
    assert d["e1"]["keep"] and d["e2"]["dup_kind"] == "exact" and d["e2"]["kept_twin"] == "e1"
    assert d["p1"]["keep"] and d["s3"]["keep"]
    # Same tokens, different bytes: one shingle each, identical signatures -> near dup.
    assert d["s1"]["keep"] and d["s2"]["dup_kind"] == "near" and d["s2"]["kept_twin"] == "s1"
    check_figures(res)
    assert deduplicate([]).figures["files_in"] == 0


def test_deterministic_under_shuffle():
    rng = random.Random(0)
    texts = [synthetic_c(s) for s in range(6)]
    recs = []
    for i in range(30):
        t = texts[i % 6]
        if i % 4 == 1:
            t = t.replace("}", "} /* x */", 2)  # near copy
        lic = rng.choice(["permissive", "gpl2"])
        recs.append(rec(f"src{i % 3}/f{i:02d}.c", t, f"src{i % 3}", i % 3, f"f{i % 5}.c", lic))
    first = deduplicate(recs)
    check_figures(first)
    assert first.figures["exact_removed"] > 0 and first.figures["near_removed"] > 0
    for _ in range(3):
        rng.shuffle(recs)
        again = deduplicate(recs)
        assert again.decisions == first.decisions and again.figures == first.figures


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="duplicate doc_key"):
        deduplicate([rec("a", "x"), rec("a", "y")])
    with pytest.raises(ValueError, match="license_class"):
        deduplicate([rec("a", "x", license_class="mit")])
