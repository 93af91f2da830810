"""Pandera schemas of the stage-4 ``decisions`` and ``duplicate_clusters`` tables (SPEC §4 row 4).

``decisions``: one row per file entering dedup with its keep/drop decision; a drop has a
``dup_kind`` (exact, near, cross_source), names a ``kept_twin`` and carries the estimated
Jaccard to it. ``duplicate_clusters``: one row per member of a duplicate cluster, with the
kept member and each member's estimated Jaccard to it. :func:`validate_decisions` backs
the blocking ``each_drop_names_kept_twin`` check of the ``dedup_decisions`` asset.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandera.pandas as pa
import pyarrow as pa_arrow

from . import TEXT, validate_frame

DUP_KINDS = ["exact", "near", "cross_source"]

DECISIONS = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(TEXT, unique=True),
        "keep": pa.Column(bool),
        "dup_kind": pa.Column(TEXT, pa.Check.isin(DUP_KINDS), nullable=True),
        "kept_twin": pa.Column(TEXT, nullable=True),
        "jaccard": pa.Column(float, pa.Check.in_range(0.0, 1.0), nullable=True),
        "cluster_id": pa.Column("int64", pa.Check.ge(-1)),
        "content_sha256": pa.Column(TEXT, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
    },
    checks=[
        pa.Check(lambda df: df["keep"] == df["kept_twin"].isna(), error="a drop names a twin, a kept file none"),
        pa.Check(lambda df: df["keep"] == df["dup_kind"].isna(), error="a drop has a dup_kind, a kept file none"),
        pa.Check(lambda df: df["keep"] | df["jaccard"].notna(), error="a drop carries its Jaccard to the twin"),
        pa.Check(lambda df: df["keep"] | (df["cluster_id"] >= 0), error="a drop belongs to a cluster"),
    ],
    strict=True,
    coerce=False,
)

CLUSTERS = pa.DataFrameSchema(
    {
        "cluster_id": pa.Column("int64", pa.Check.ge(0)),
        "cluster_size": pa.Column("int64", pa.Check.ge(2)),
        "doc_key": pa.Column(TEXT, unique=True),
        "source": pa.Column(TEXT),
        "is_kept": pa.Column(bool),
        "kept_doc_key": pa.Column(TEXT),
        "dup_kind": pa.Column(TEXT, pa.Check.isin(DUP_KINDS), nullable=True),
        "jaccard_to_kept": pa.Column(float, pa.Check.in_range(0.0, 1.0)),
    },
    checks=[
        pa.Check(lambda df: df.groupby("cluster_id")["is_kept"].sum() == 1, error="exactly one kept member per cluster"),
        pa.Check(lambda df: df.groupby("cluster_id")["doc_key"].count() == df.groupby("cluster_id")["cluster_size"].first(),
                 error="cluster_size counts the members"),
        pa.Check(lambda df: df["is_kept"] == (df["doc_key"] == df["kept_doc_key"]), error="kept_doc_key names the kept member"),
    ],
    strict=True,
    coerce=False,
)


def validate_decisions_table(decisions: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``decisions`` table alone; ``(passed, detail)``."""
    return validate_frame(DECISIONS, decisions, "decisions")


def validate_clusters(clusters: pa_arrow.Table) -> tuple[bool, str]:
    """Validate a ``duplicate_clusters`` table alone; ``(passed, detail)``."""
    return validate_frame(CLUSTERS, clusters, "duplicate_clusters")


def validate_decisions(decisions: pa_arrow.Table, clusters: pa_arrow.Table) -> tuple[bool, str]:
    """Validate both stage-4 tables and their joint rule: every drop's ``kept_twin`` is a
    kept file, and every drop appears in ``duplicate_clusters`` with that kept member.
    Returns ``(passed, detail)``; never raises on bad rows."""
    for schema, name, t in ((DECISIONS, "decisions", decisions), (CLUSTERS, "duplicate_clusters", clusters)):
        ok, detail = validate_frame(schema, t, name)
        if not ok:
            return ok, detail
    d = decisions.to_pydict()
    kept = {k for k, keep in zip(d["doc_key"], d["keep"]) if keep}
    drops = {k: t for k, keep, t in zip(d["doc_key"], d["keep"], d["kept_twin"]) if not keep}
    bad = [k for k, t in drops.items() if t not in kept]
    if bad:
        return False, f"{len(bad)} drops name a twin that is not kept, first {bad[0]}"
    c = clusters.to_pydict()
    listed = {k: t for k, kk, t in zip(c["doc_key"], c["is_kept"], c["kept_doc_key"]) if not kk}
    if listed != drops:
        return False, f"duplicate_clusters lists {len(listed)} dropped members, decisions {len(drops)}"
    return True, f"{len(drops)} drops, each naming a kept twin listed in duplicate_clusters"


# ---------------------------------------------------------------- committed files, row group by row group
# The snapshot's tables are validated as committed without holding them: the pandera
# schemas run on one row group (decisions) or one run of whole clusters (clusters) at a
# time; what spans row groups is carried as order (doc keys ascending) or as 64-bit hashes
# of the drops' keys (16 bytes per drop).


#: The 64-bit value :func:`_hashes` gives a null (BLAKE2b of nothing, personalized).
_NULL_HASH = int.from_bytes(hashlib.blake2b(b"", digest_size=8, person=b"null").digest(), "little")


def _hashes(col) -> np.ndarray:
    """``uint64[n]``: the 64-bit BLAKE2b digest (``hashlib``, ``digest_size=8``, read
    little-endian) of each string of ``col`` (arrow) as UTF-8; a null gets
    :data:`_NULL_HASH`. Used to compare the key sets of tables read in one process (16
    bytes per drop), so any fixed 64-bit hash serves; a cryptographic one has no
    structured collisions. About 0.6 µs a key in one Python step each: 0.5 ms on
    ``default``'s 762 keys. polars' vectorized hash, used before, is 0.15 µs a key, but
    importing polars took 0.11–0.14 s of the dedup gate in every process that ran it
    (``megacpp run``'s calling process, on the path to the tokenizer)."""
    values = (col.combine_chunks() if isinstance(col, pa_arrow.ChunkedArray) else col).to_pylist()
    digest = hashlib.blake2b
    return np.fromiter((_NULL_HASH if v is None else int.from_bytes(
        digest(v.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") for v in values),
        dtype=np.uint64, count=len(values))


#: Rows validated at a time (whole row groups gathered up to about this many): pandera's
#: cost per call dominates on 1,024-row groups; implementation choice.
VALIDATE_ROWS = 65_536


def _row_groups(pf, rows: int | None = None):
    """Tables of consecutive whole row groups of ``pf``, about ``rows`` (default
    :data:`VALIDATE_ROWS`) rows each."""
    rows = VALIDATE_ROWS if rows is None else rows
    group, held = [], 0
    for i in range(pf.num_row_groups):
        group.append(i)
        held += pf.metadata.row_group(i).num_rows
        if held >= rows:
            yield pf.read_row_groups(group, use_threads=False)
            group, held = [], 0
    if group or not pf.num_row_groups:
        yield pf.read_row_groups(group, use_threads=False) if group else pf.schema_arrow.empty_table()


def _check_ascending(keys, last, what: str) -> tuple[bool, str, object]:
    """``keys`` (a string column) strictly ascending and above ``last`` (the previous row
    group's last key, or None); ``(ok, detail, new last)``."""
    import pyarrow.compute as pc

    keys = keys.combine_chunks() if hasattr(keys, "combine_chunks") else keys
    if not len(keys):
        return True, "", last
    if len(keys) > 1 and not pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py():
        return False, f"{what}: doc_key not strictly ascending within a row group", last
    if last is not None and not keys[0].as_py() > last:
        return False, f"{what}: doc_key {keys[0].as_py()!r} after {last!r} (not strictly ascending)", last
    return True, "", keys[len(keys) - 1].as_py()


def validate_decisions_file(pf) -> tuple[bool, str]:
    """Validate a committed ``decisions`` file (``pyarrow.parquet.ParquetFile``) one row
    group at a time: :data:`DECISIONS` on each, ``doc_key`` strictly ascending across the
    file (so unique). ``(passed, detail)``; never raises on bad rows."""
    last, rows = None, 0
    for t in _row_groups(pf):
        ok, detail = validate_frame(DECISIONS, t, "decisions")
        if not ok:
            return ok, f"{detail} (rows from {rows})"
        ok, detail, last = _check_ascending(t.column("doc_key"), last, "decisions")
        if not ok:
            return ok, detail
        rows += t.num_rows
    return True, f"decisions: {rows} rows valid"


def _cluster_runs(pf):
    """Tables of whole clusters (rows of one ``cluster_id`` never split), from row groups."""
    import pyarrow.compute as pc

    pending = None
    for t in _row_groups(pf):
        t = pa_arrow.concat_tables([pending, t]) if pending is not None else t
        if not t.num_rows:
            continue
        cid = t.column("cluster_id")
        last = cid[t.num_rows - 1]
        cut = t.num_rows - int(pc.sum(pc.equal(cid, last)).as_py())
        if cut:
            yield t.slice(0, cut)
        pending = t.slice(cut)
    if pending is not None and pending.num_rows:
        yield pending


def validate_clusters_file(pf) -> tuple[bool, str]:
    """Validate a committed ``duplicate_clusters`` file one run of whole clusters at a time
    (:data:`CLUSTERS` on each, so the per-cluster checks see every member), with
    ``cluster_id`` ascending across runs and ``doc_key`` unique over the file (64-bit
    hashes). ``(passed, detail)``; never raises on bad rows."""
    import pyarrow.compute as pc

    last, rows, hashes = -1, 0, []
    for t in _cluster_runs(pf):
        ok, detail = validate_frame(CLUSTERS, t, "duplicate_clusters")
        if not ok:
            return ok, detail
        cid = t.column("cluster_id")
        if pc.min(cid).as_py() <= last or (t.num_rows > 1 and not pc.all(
                pc.less_equal(cid.slice(0, t.num_rows - 1), cid.slice(1))).as_py()):
            return False, "duplicate_clusters: cluster_id not ascending (a cluster split in two runs)"
        last = pc.max(cid).as_py()
        hashes.append(_hashes(t.column("doc_key")))
        rows += t.num_rows
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    if np.unique(h).size != h.size:
        return False, "duplicate_clusters: a doc_key is listed twice"
    return True, f"duplicate_clusters: {rows} rows valid"


def validate_decisions_files(decisions_pf, clusters_pf, tables_checked: bool = False) -> tuple[bool, str]:
    """Validate both committed stage-4 files (:func:`validate_decisions_file`,
    :func:`validate_clusters_file`) and their joint rule, streamed: every drop's
    ``kept_twin`` is a kept file heading a cluster, and the dropped members of
    ``duplicate_clusters`` with their kept member are exactly the drops with their twin
    (compared as 64-bit hashes of the key pairs: 16 bytes per drop). ``(passed, detail)``.
    ``tables_checked``: the per-table rules already ran (the files' own ``_schema`` checks),
    so only the joint rule is checked."""
    import pyarrow.compute as pc

    for fn, pf in ((validate_decisions_file, decisions_pf), (validate_clusters_file, clusters_pf)):
        ok, detail = fn(pf) if not tables_checked else (True, "")
        if not ok:
            return ok, detail
    drops, roots, listed = [], [], []
    for t in _row_groups(decisions_pf):
        keep = t.column("keep")
        d = t.filter(pc.invert(keep))
        drops.append(np.stack((_hashes(d.column("doc_key")), _hashes(d.column("kept_twin"))), axis=1))
        k = t.filter(pc.and_(keep, pc.greater_equal(t.column("cluster_id"), 0)))
        roots.append(_hashes(k.column("doc_key")))
    for t in _row_groups(clusters_pf):
        d = t.filter(pc.invert(t.column("is_kept")))
        listed.append(np.stack((_hashes(d.column("doc_key")), _hashes(d.column("kept_doc_key"))), axis=1))
    drops = np.concatenate(drops) if drops else np.zeros((0, 2), np.uint64)
    roots = np.concatenate(roots) if roots else np.zeros(0, np.uint64)
    listed = np.concatenate(listed) if listed else np.zeros((0, 2), np.uint64)
    bad = ~np.isin(drops[:, 1], roots)
    if bad.any():
        return False, f"{int(bad.sum())} drops name a twin that is not a kept cluster head"
    if len(listed) != len(drops) or not np.array_equal(np.unique(listed, axis=0), np.unique(drops, axis=0)):
        return False, f"duplicate_clusters lists {len(listed)} dropped members, decisions {len(drops)} (or other twins)"
    return True, f"{len(drops)} drops, each naming a kept twin listed in duplicate_clusters"
