"""Stage 2 — license scan and filter (SPEC §4 "License").

Per repo revision × shard (:mod:`megacpp_core.sharding`). Inputs: ``license_texts`` (the license files of the
whole revision tree, written by acquire) and the shard's ``quality_kept``. Output: ``license`` — one decision per kept file (SPDX expression,
class, accept / accept_tagged / refuse, reason, origin). The evidence rules and ScanCode
wrapper are :mod:`megacpp_core.license`; the ScanCode index loads once per process.

For a Debian source package, ``debian/copyright`` (DEP-5) is a second signal
(:mod:`megacpp_core.dep5`): each kept file gets its Files paragraph's license and the
``agreement`` of the two; ``settings.license_dep5_policy`` chooses what decides where they
differ (default: the stricter of the two). A free-form copyright file is recorded as such.
"""

from __future__ import annotations

import pyarrow as pa

from .. import acquire, catalog, dep5, license, license_scancode
from ..stage import Partitioning, Result, Stage
from ..tables import value_counts

SETTINGS = ("license_unknown_decision", "license_weak_copyleft_decision", "license_gpl2_decision",
            "refused_sources", "license_permissive_ids", "license_refused_ids", "license_dep5_policy")

LICENSE_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("path", pa.string()),
    ("spdx_expression", pa.string()), ("license_class", pa.string()), ("decision", pa.string()),
    ("reason", pa.string()), ("origin", pa.string()), ("license_file", pa.string()),
    ("license_scancode", pa.string()), ("license_dep5", pa.string()), ("dep5_pattern", pa.string()),
    ("agreement", pa.string()), ("decided_by", pa.string()),
])

_SCANNER: license.Scanner | None = None
#: Folder of the ScanCode result store under the data root's local cache (``ctx.cache_dir``).
STORE_DIR = "scancode-results"


def shared_scanner() -> license.Scanner:
    """One ScanCode wrapper per process: its index loads once and its cache is shared."""
    global _SCANNER
    if _SCANNER is None:
        _SCANNER = license.Scanner()
    return _SCANNER


def license_policy(settings) -> license.LicensePolicy:
    """The license policy from a snapshot's settings (SPEC §4 defaults)."""
    return license.LicensePolicy(unknown_decision=settings.license_unknown_decision,
                                 weak_copyleft_decision=settings.license_weak_copyleft_decision,
                                 gpl2_decision=settings.license_gpl2_decision,
                                 refused_sources=frozenset(settings.refused_sources),
                                 extra_permissive=frozenset(settings.license_permissive_ids),
                                 extra_refused=frozenset(settings.license_refused_ids))


def compute(ctx) -> Result:
    files = ctx.input("license_texts").read(columns=["path", "content", "size"])
    kept = ctx.input("quality_kept").read(columns=["doc_key", "path", "text"])
    kept_text = dict(zip(kept.column("path").to_pylist(), kept.column("text").to_pylist()))
    texts: dict[str, str] = dict(kept_text)  # this shard's kept files, then the tree's license files
    copyright_file = None
    for p, b, size in zip(files.column("path").to_pylist(), files.column("content").to_pylist(), files.column("size").to_pylist()):
        if p == dep5.COPYRIGHT_PATH and ctx.source.kind == "debian":
            copyright_file = dep5.parse_copyright(b)
        if p not in texts and license.is_license_file(p) and size <= acquire.MAX_LICENSE_FILE_BYTES:
            texts[p] = b.decode("utf-8", errors="replace")
    scanner = ctx.tool("scancode")
    if isinstance(scanner, license.Scanner):
        scanner.use_store(ctx.cache_dir / STORE_DIR)
    before = (scanner.scans, scanner.cache_hits, getattr(scanner, "store_hits", 0), license_scancode.LOAD["seconds"])
    policy = license_policy(ctx.settings)
    rows = license.scan_revision(ctx.source.name, texts, kept_text.keys(), policy, scanner)
    if ctx.source.kind == "debian" and copyright_file is None:
        copyright_file = dep5.Dep5(False, reason="the source package has no debian/copyright")
    rows = [dep5.reconcile(r, copyright_file, ctx.settings.license_dep5_policy, policy) for r in rows]
    key_by_path = dict(zip(kept.column("path").to_pylist(), kept.column("doc_key").to_pylist()))
    cols = {f.name: [] for f in LICENSE_SCHEMA}
    for r in rows:
        cols["doc_key"].append(key_by_path[r["path"]])
        cols["source"].append(ctx.source.name)
        for k in LICENSE_SCHEMA.names[2:]:
            cols[k].append(r.get(k))
    table = pa.table(cols, schema=LICENSE_SCHEMA)
    figures = {"files_in": table.num_rows, "files_out": int(sum(1 for d in cols["decision"] if d != "refuse")),
               "classes": value_counts(table.column("license_class")), "decisions": value_counts(table.column("decision")),
               "origins": value_counts(table.column("origin")), "expressions": value_counts(table.column("spdx_expression")),
               "scancode_runs": scanner.scans - before[0], "scancode_cache_hits": scanner.cache_hits - before[1],
               "scancode_store_hits": getattr(scanner, "store_hits", 0) - before[2],
               "scancode_index_load_seconds": round(license_scancode.LOAD["seconds"] or 0.0, 2) if before[3] is None else 0.0,
               "dep5": dep5.summary(rows, copyright_file)}
    return Result({"license": table}, figures)


def every_file_decided(g):
    """One accept / accept_tagged / refuse decision for every kept file."""
    decided = g.value("license")
    kept = g.input("quality_kept").parquet_file().metadata.num_rows
    decisions = decided.column("decision").to_pylist()
    undecided = sum(1 for d in decisions if d not in ("accept", "accept_tagged", "refuse"))
    return (undecided == 0 and decided.num_rows == kept,
            f"{decided.num_rows} decisions for {kept} kept files, {undecided} undecided")


STAGE = Stage(
    name="license", asset="license_files", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="2",
    description="Stage 2: ScanCode license detection; SPDX expression, class and decision per file.",
    inputs=(catalog.LICENSE_TEXTS, catalog.QUALITY_KEPT), outputs=(catalog.LICENSE,), settings=SETTINGS,
    gates=(every_file_decided,), tools={"scancode": shared_scanner},
    figures=("files_in", "files_out", "classes", "decisions", "origins", "expressions", "scancode_runs",
             "scancode_cache_hits", "scancode_store_hits", "scancode_index_load_seconds", "dep5"),
)
