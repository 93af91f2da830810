"""The libclang lane wired into the snapshot (issue: per-revision compile_commands and
semantic_graph assets, edges replacing tree-sitter's in stage 6, per-snapshot switch)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from dagster import AssetKey

from megacpp_checks.schemas import semantic as semantic_schema
from megacpp_core import enrich, manifest, stages
from megacpp_core.layout import SnapshotLayout
from megacpp_core.tables import read_parquet
from tests.conftest import PROJECT, make_data_root

SEMTEST = """name: semtest
settings:
  semantic_graph: true
sources:
  - {name: lz4-4.4.5, kind: pypi, package: lz4, version: 4.4.5, sha256: 5f0b9e53c1e82e88c10d7c180069363980136b9d7a8306c4dca4f760d60c39f0}
  - {name: xxhash-4.1.0, kind: pypi, package: xxhash, version: 4.1.0, sha256: c9b288e4c1f5dae54417bc8a05e6f6daf505783d916b4783f4dd2f2e7d5db486}
"""


def test_switched_per_snapshot():
    assert manifest.load_manifest(PROJECT / "corpora" / "tiny.yaml").settings.semantic_graph is False
    assert manifest.load_manifest(PROJECT / "corpora" / "default.yaml").settings.semantic_graph is False
    assert manifest.load_manifest(PROJECT / "corpora" / "large.yaml").settings.semantic_graph is True


def test_assets_tags_pool_and_lineage():
    from megacpp_assets import definitions as d
    from megacpp_assets import profiles

    graph = d.defs.resolve_asset_graph()
    for name in ("compile_commands", "semantic_graph"):
        node = graph.get(AssetKey(name))
        assert node.partitions_def.name == "repo_revision"
    sg = d.defs.resolve_assets_def(AssetKey("semantic_graph"))
    node = sg.node_def
    assert json.loads(node.tags["dagster-k8s/config"]) == profiles.HEAVY_STEP_TAGS["libclang"]["dagster-k8s/config"]
    assert node.pool == profiles.POOLS["libclang"] == "megacpp-libclang"
    assert AssetKey("compile_commands") in graph.get(AssetKey("semantic_graph")).parent_keys
    assert AssetKey("semantic_graph") in graph.get(AssetKey("chunked_documents")).parent_keys
    assert {c.name for c in sg.check_specs} == {"every_tu_accounted", "semantic_edges_schema", "build_info_schema"}


def test_line_units_map_lines_to_the_unit_they_start_in():
    text = "int a;\n\n// doc\nint f() {\n  return 1;\n}\nint g() { return f(); }\n"
    units = enrich.file_units(text, "cpp")
    names = [u[3] for u in units]
    lines = np.arange(1, 9)
    got = enrich.line_units(text, units, lines)
    assert [names[i] if i >= 0 else None for i in got] == [None, "f", "f", "f", "f", "f", "g", None]
    assert enrich.line_units(text, units, np.array([0, 99])).tolist() == [-1, -1]


@pytest.fixture(scope="module")
def semtest(tmp_path_factory):
    from dagster import DagsterInstance

    from megacpp_assets.cli import run_snapshot

    root = make_data_root(tmp_path_factory.mktemp("semtest-root"))
    home = tmp_path_factory.mktemp("semtest-home")
    path = tmp_path_factory.mktemp("semtest-manifest") / "semtest.yaml"
    path.write_text(SEMTEST)
    old = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            assert run_snapshot(str(path), str(root), instance=instance) == 0
            yield SnapshotLayout(root, "semtest"), instance, path
    finally:
        if old is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = old


def test_lane_outputs_and_checks(semtest):
    layout, instance, _ = semtest
    for src in ("lz4-4.4.5", "xxhash-4.1.0"):
        rdir = layout.revision(src)
        db = json.loads((rdir / "compile_commands.json").read_text())
        assert db["shipped"] is False and db["revision"] and db["inputs_sha256"]
        edges = read_parquet(rdir / "semantic_edges.parquet")
        ok, detail = semantic_schema.validate_edges(edges)
        assert ok, detail
        bi = read_parquet(rdir / "build_info.parquet").to_pydict()
        assert bi["file"] and set(bi["status"]) <= {"ok", "errors", "fatal", "timeout", "crashed"}
        assert all(args for args in bi["arguments"])
        figs = layout.read_figures("semantic_graph", src)
        assert figs["enabled"] and figs["tu_coverage"] >= 0.9 and figs["call_coverage"] >= 0.8
    from dagster import AssetCheckKey

    for asset in ("compile_commands", "semantic_graph", "chunked_documents", "tokenized_documents"):
        for name in stages.by_name(asset).check_names:
            key = AssetCheckKey(AssetKey(asset), name)
            ex = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
            assert ex.evaluation.passed, (asset, name)
    card = layout.card.read_text()
    assert "### libclang semantic graph lane" in card and "| lz4-4.4.5 | 8 |" in card


def _lane_edges(layout, m):
    """The lane's edges as the chunk stage reads them (its declared inputs, through the runner's context)."""
    from megacpp_core import catalog
    from megacpp_core.runner import StageContext
    from megacpp_core.stage import Partition
    from megacpp_core.stages import chunk as chunk_stage
    from megacpp_core.storage import DataRoot

    ctx = StageContext(chunk_stage.STAGE, DataRoot(layout.data_root), m, Partition(m.name))
    assert {catalog.SEMANTIC_EDGES, catalog.BUILD_INFO} <= set(chunk_stage.STAGE.inputs)
    lane, figs = chunk_stage.semantic_unit_edges(ctx)
    assert figs["semantic_covered_files"] == len(lane)
    return lane


def test_lane_edges_replace_tree_sitter_edges(semtest):
    layout, _, path = semtest
    m = manifest.load_manifest(path)
    lane = _lane_edges(layout, m)
    chunk_figs = layout.read_figures("chunk")
    assert chunk_figs["semantic_covered_files"] == len(lane) > 0
    assert chunk_figs["semantic_graph"] is True and chunk_figs["documents_with_semantic_edges"] > 0
    docs = layout.documents("chunks").to_pydict()
    kept = layout.kept_files().to_pydict()
    text_of = dict(zip(kept["doc_key"], zip(kept["text"], kept["language"])))
    compared = with_edges = 0
    for i, fk in enumerate(docs["file_key"]):
        if fk not in lane:
            continue
        text, lang = text_of[fk]
        fe = enrich.enrich_file(text, lang)
        start, end = docs["start"][i], docs["end"][i]
        picked = [k for k, u in enumerate(fe.units) if u.end > start and u.start < end]
        index = {k: j for j, k in enumerate(picked)}
        want = sorted((index[a], index[b]) for a, b in lane[fk]["call"] if a in index and b in index and a != b)
        got = sorted((e["from"], e["to"]) for e in docs["call_edges"][i])
        assert got == want, fk
        compared += 1
        with_edges += bool(want)
    assert compared > 0 and with_edges > 0


def test_p4_pieces_carry_the_lanes_cross_file_edges(semtest):
    """With the lane on, the p4_structure documents link files of one piece: every chunk
    edge between two files of a piece is a resolved libclang edge between those files'
    units (read back through each file's unit list), their count is the stage's figure,
    and there are some; the packed p4 rows pass the row contract with them."""
    from megacpp_checks.packed import verify_packed_dir
    from megacpp_core import repo_documents as rd
    from megacpp_core import structure_documents as sd
    from megacpp_core.tokenizer import SPECIAL_TOKENS

    layout, _, _ = semtest
    cross = 0
    for src in ("lz4-4.4.5", "xxhash-4.1.0"):
        rdir = layout.revision(src)
        lane = sd.lane_from_tables(read_parquet(rdir / "semantic_edges.parquet"), read_parquet(rdir / "build_info.parquet"))
        want = {(kind, fp, fu, tp, tu) for kind, fp, fu, tp, tu in lane.cross}
        figs = layout.read_figures("structure_documents", src)
        assert figs["semantic_graph"] is True and figs["chunks_without_tokens"] == 0
        found = 0
        for r in read_parquet(rdir / "families" / "p4_structure.parquet").to_pylist():
            if r["paths"] is None:
                continue
            # each chunk's (file, unit index): a piece's chunks are its files' units in order
            # (none was dropped for holding no token start: chunks_without_tokens is 0)
            seps = [i for i, t in enumerate(r["input_ids"]) if t == SPECIAL_TOKENS.index(rd.FILE_SEP)]
            where = [max(i for i, s in enumerate(seps) if s < c["start"]) for c in r["chunk_boundaries"]]
            unit = [where[:i].count(where[i]) for i in range(len(where))]
            for kind, col in (("call", "call_edges"), ("type", "type_edges")):
                for e in r[col]:
                    a, b = e["from"], e["to"]
                    if where[a] != where[b]:
                        found += 1
                        assert (kind, r["paths"][where[a]], unit[a], r["paths"][where[b]], unit[b]) in want, (r["doc_key"], e)
        assert found == figs["cross_file_call_edges"] + figs["cross_file_type_edges"]
        cross += found
    assert cross > 0
    gate = verify_packed_dir(layout.root / "families" / "p4_structure" / "packed", out=lambda m: None)
    assert gate.ok, gate.failures


def test_stale_database_is_refused(semtest, tmp_path):
    layout, _, path = semtest
    m = manifest.load_manifest(path)
    src = m.source("xxhash-4.1.0")
    db_path = layout.revision(src.name) / "compile_commands.json"
    original = db_path.read_text()
    try:
        doc = json.loads(original)
        doc["revision"] = "0" * 64
        db_path.write_text(json.dumps(doc))
        with pytest.raises(stages.StageError, match="no current compile database"):
            stages.run("semantic_graph", layout.data_root, m, src)
    finally:
        db_path.write_text(original)


def test_lane_off_for_tiny(tiny_run):
    root, _ = tiny_run
    layout = SnapshotLayout(root, "tiny")
    assert layout.read_figures("semantic_graph", "lz4-4.4.5") is not None
    assert layout.read_figures("semantic_graph", "lz4-4.4.5")["enabled"] is False
    assert not (layout.revision("lz4-4.4.5") / "semantic_edges.parquet").exists()
    assert layout.read_figures("chunk")["semantic_graph"] is False
    assert "Off for this snapshot (`settings.semantic_graph: false`)" in layout.card.read_text()


KEY_C = (
    "// SPDX-License-Identifier: MIT\n"
    "/* A test key table: the private key below is redacted by the scrub stage. */\n"
    "static const char *test_key =\n"
    '"-----BEGIN RSA PRIVATE KEY-----\\n"\n'
    '"MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi6tWAr3x5KYXk3sQ1Zq6Xv9dE\\n"\n'
    '"Jq1c3kLrN6n0R8cYw4D2QmQ9vO1aXr0pWz4uXo9H0N1S9Yk0qL2c8F7mZ1yT3bQ\\n"\n'
    '"-----END RSA PRIVATE KEY-----\\n";\n'
    "\n"
    "static int helper(int v) { return v * 2 + (int)test_key[0]; }\n"
    "\n"
    "int caller(int v) {\n"
    "    return helper(v) + helper(v + 1);\n"
    "}\n"
)


def test_lane_lines_follow_the_scrubbed_text(tmp_path):
    """A multi-line redaction shortens the file: libclang must see the scrubbed text, so its
    line numbers land on the units the documents are cut from (and no secret reaches it)."""
    from megacpp_core import scrub

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    (src_dir / "key.c").write_text(KEY_C)
    m_path = tmp_path / "lane.yaml"
    m_path.write_text(f"name: lanelines\nsettings:\n  semantic_graph: true\nsources:\n"
                      f"  - {{name: keys, kind: local, path: {src_dir}, label: t1}}\n")
    m = manifest.load_manifest(m_path)
    layout = SnapshotLayout(make_data_root(tmp_path / "root"), m.name)
    src = m.sources[0]
    for stage in ("acquire", "quality", "license", "scrub", "compile_commands", "semantic_graph"):
        stages.run(stage, layout.data_root, m, src)
    text = read_parquet(layout.shard(src.name) / "scrubbed.parquet").column("text")[0].as_py()
    assert text.count("\n") < KEY_C.count("\n") and not scrub.find_leaks(text)
    edges = read_parquet(layout.revision(src.name) / "semantic_edges.parquet").to_pydict()
    units = enrich.file_units(text, "c")
    calls = [(units[a][3], units[b][3]) for k, a, b in zip(edges["kind"], edges["from_chunk"], edges["to_chunk"]) if k == "call"]
    assert calls == [("caller", "helper")]
    lines = text.split("\n")
    k = edges["kind"].index("call")
    assert "helper(v)" in lines[edges["from_line"][k] - 1] and "static int helper" in lines[edges["to_line"][k] - 1]
