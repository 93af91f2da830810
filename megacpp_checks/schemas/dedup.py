"""Pandera schemas of the stage-4 ``decisions`` and ``duplicate_clusters`` tables (SPEC §4 row 4).

``decisions``: one row per file entering dedup with its keep/drop decision; a drop has a
``dup_kind`` (exact, near, cross_source), names a ``kept_twin`` and carries the estimated
Jaccard to it. ``duplicate_clusters``: one row per member of a duplicate cluster, with the
kept member and each member's estimated Jaccard to it. :func:`validate_decisions` backs
the blocking ``each_drop_names_kept_twin`` check of the ``dedup_decisions`` asset.
"""

from __future__ import annotations

import pandera.pandas as pa
import pyarrow as pa_arrow

from . import validate_frame

DUP_KINDS = ["exact", "near", "cross_source"]

DECISIONS = pa.DataFrameSchema(
    {
        "doc_key": pa.Column(str, unique=True),
        "keep": pa.Column(bool),
        "dup_kind": pa.Column(str, pa.Check.isin(DUP_KINDS), nullable=True),
        "kept_twin": pa.Column(str, nullable=True),
        "jaccard": pa.Column(float, pa.Check.in_range(0.0, 1.0), nullable=True),
        "cluster_id": pa.Column("int64", pa.Check.ge(-1)),
        "content_sha256": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
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
        "doc_key": pa.Column(str, unique=True),
        "source": pa.Column(str),
        "is_kept": pa.Column(bool),
        "kept_doc_key": pa.Column(str),
        "dup_kind": pa.Column(str, pa.Check.isin(DUP_KINDS), nullable=True),
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
