"""Stage 7 chunk-level dedup: only FUNC_BODY, CLASS_DECL, TYPEDEF and NAMESPACE chunks are
ever dropped (SPEC §4), on hostile tables and on the real chunks of the tiny snapshot."""

from __future__ import annotations

import pyarrow as pa

from megacpp_core.chunk_dedup import NEVER_DROPPED, WHITELIST, dedup_chunks
from megacpp_core.layout import SnapshotLayout
from megacpp_core.tables import read_parquet

ALL_KINDS = sorted(WHITELIST | NEVER_DROPPED)


def table(rows):
    return pa.table({"doc_key": [r[0] for r in rows], "kind": [r[1] for r in rows], "text": [r[2] for r in rows]})


def test_kind_sets_match_the_spec():
    assert WHITELIST == {"FUNC_BODY", "CLASS_DECL", "TYPEDEF", "NAMESPACE"}
    assert NEVER_DROPPED == {"OTHER", "PREAMBLE", "FUNC_SIGNATURE", "CLASS_MEMBER", "COMMENT"}
    assert not WHITELIST & NEVER_DROPPED


def test_identical_chunks_of_every_kind_only_whitelisted_dropped():
    body = "int f(int x) {\n  return x + 1;\n}\n"
    rows = []
    for kind in ALL_KINDS:
        for copy, text in enumerate((body, body.replace("\n", "\n\n  "), body)):  # whitespace variants too
            rows.append((f"{kind}#{copy}", kind, text))
    rows += [("odd#0", "NOT_A_KIND", body), ("odd#1", "NOT_A_KIND", body), ("lower#0", "func_body", body),
             ("lower#1", "func_body", body)]
    kept, drops, fig = dedup_chunks(table(rows))
    kept_keys = set(kept.column("doc_key").to_pylist())
    for kind in ALL_KINDS:
        if kind in WHITELIST:
            assert f"{kind}#0" in kept_keys and f"{kind}#1" not in kept_keys and f"{kind}#2" not in kept_keys
        else:
            assert {f"{kind}#0", f"{kind}#1", f"{kind}#2"} <= kept_keys, kind
    assert {"odd#0", "odd#1", "lower#0", "lower#1"} <= kept_keys  # unknown kinds are never dropped
    d = drops.to_pydict()
    assert set(d["kind"]) == WHITELIST
    assert all(t in kept_keys and t.split("#")[0] == k.split("#")[0] for k, t in zip(d["doc_key"], d["kept_twin"]))
    assert fig["chunks_in"] == len(rows) == fig["chunks_out"] + sum(fig["dropped"].values())


def test_real_chunks_duplicated_never_lose_a_non_whitelisted_chunk(tiny_run):
    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    docs = layout.documents("chunks")
    kinds = docs.column("kind").to_pylist()
    assert set(kinds) - WHITELIST, "the tiny snapshot has non-whitelisted chunks"
    twice = pa.concat_tables([docs, docs.set_column(0, "doc_key", pa.array([k + "~copy" for k in docs.column("doc_key").to_pylist()]))])
    kept, drops, fig = dedup_chunks(twice)
    kept_keys = set(kept.column("doc_key").to_pylist())
    for key, kind in zip(twice.column("doc_key").to_pylist(), twice.column("kind").to_pylist()):
        if kind not in WHITELIST:
            assert key in kept_keys, (key, kind)
    assert set(drops.column("kind").to_pylist()) <= WHITELIST
    n_white = sum(k in WHITELIST for k in kinds)
    assert drops.num_rows >= n_white  # every whitelisted copy is a duplicate of its original
    stored = read_parquet(layout.stage_dir("documents") / "chunk_drops.parquet")
    assert set(stored.column("kind").to_pylist()) <= WHITELIST
    assert layout.read_figures("chunk_dedup")["chunks_in"] == docs.num_rows


def test_stage_reads_texts_only_of_shards_with_whitelisted_chunks(tmp_path):
    """The snapshot step reads a shard's ``kind`` column first: a shard without a
    whitelisted chunk never has its texts read (here it has no ``text`` column at all, so
    reading it would raise), and the other shard's duplicates are dropped."""
    import types

    import pyarrow.parquet as pq

    from megacpp_core.stages import chunk_dedup as stage

    def shard(name, rows, with_text=True):
        t = pa.table({"doc_key": [r[0] for r in rows], "license_class": ["permissive"] * len(rows),
                      "source": ["s"] * len(rows), "path": [r[0].split("#")[0] for r in rows],
                      "chunk_index": pa.array(range(len(rows)), pa.int32()), "kind": [r[1] for r in rows]})
        if with_text:
            t = t.append_column("text", pa.array([r[2] for r in rows], pa.string()))
        pq.write_table(t, tmp_path / name)
        return types.SimpleNamespace(parquet_file=lambda: pq.ParquetFile(tmp_path / name))

    body = "int f(int x) {\n  return x + 1;\n}\n"
    no_whitelisted = shard("a.parquet", [("a.c#0", "OTHER", ""), ("a.c#1", "PREAMBLE", "")], with_text=False)
    dupes = shard("b.parquet", [("b.c#0", "FUNC_BODY", body), ("b.c#1", "FUNC_BODY", body), ("b.c#2", "OTHER", body)])
    ctx = types.SimpleNamespace(inputs=lambda name: [no_whitelisted, dupes], sources=[types.SimpleNamespace(name="s")])
    out = stage.compute(ctx)
    drops = out.outputs["chunk_drops"]
    assert drops.column("doc_key").to_pylist() == ["b.c#1"] and drops.column("kept_twin").to_pylist() == ["b.c#0"]
    assert out.figures["chunks_in"] == 5 and out.figures["whitelisted_chunks"] == 2
