"""Stage 3 — PII and secret scrub (SPEC §4 "Scrub"), before tokenization, never after.

Per repo revision × shard (:mod:`megacpp_core.sharding`). Inputs: the shard's ``quality_kept`` and ``license`` (refused files
are dropped here) and the revision's ``shard_plan`` (the revision id). Output: ``scrubbed`` — the scrubbed text of every
license-accepted file with its license provenance. Fail closed: a re-scan of each output
text must find nothing (:func:`megacpp_core.scrub.scrub_text` raises otherwise); a file
whose scrubbed text still holds something is left out of the output and named in the
figures (``dropped_by_rescan``), and the ``rescan_finds_nothing`` gate re-reads what was
committed. The
detectors are :mod:`megacpp_core.scrub`.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from .. import catalog, scrub
from ..stage import Partitioning, Result, Stage

SCRUBBED_SCHEMA = pa.schema([
    ("doc_key", pa.string()), ("source", pa.string()), ("source_order", pa.int32()), ("path", pa.string()),
    ("language", pa.string()), ("archive_sha256", pa.string()), ("license_class", pa.string()),
    ("license_decision", pa.string()), ("spdx_expression", pa.string()), ("content_sha256", pa.string()),
    ("text", pa.large_string()),
])
#: Redactions kept in the figures for human review (the card shows 20 over all sources).
SAMPLES = 20


def compute(ctx) -> Result:
    source = ctx.source
    kept = ctx.input("quality_kept").read()
    lic = ctx.input("license").read()
    revision = ctx.input("shard_plan").read_json().get("revision") or source.sha256
    decision = {k: (c, d, e) for k, c, d, e in zip(lic.column("doc_key").to_pylist(), lic.column("license_class").to_pylist(),
                                                 lic.column("decision").to_pylist(), lic.column("spdx_expression").to_pylist())}
    cols = {f.name: [] for f in SCRUBBED_SCHEMA}
    counts: dict[str, int] = {}
    samples: list[dict] = []
    leaking: list[dict] = []
    for key, path, lang, text in zip(kept.column("doc_key").to_pylist(), kept.column("path").to_pylist(),
                                     kept.column("language").to_pylist(), kept.column("text").to_pylist()):
        cls, dec, expr = decision[key]
        if dec == "refuse":
            continue
        try:
            r = scrub.scrub_text(text)  # re-scans its own output; raises LeakError if anything remains
        except scrub.LeakError as e:  # fail closed on the file: it is left out, named in the figures
            leaking.append({"doc_key": key, "why": str(e)})
            continue
        for k, v in r.counts.items():
            counts[k] = counts.get(k, 0) + v
        for smp in r.samples:
            if len(samples) < SAMPLES:
                samples.append({"doc_key": key, **smp})
        for name, value in (("doc_key", key), ("source", source.name), ("source_order", source.order), ("path", path),
                            ("language", lang), ("archive_sha256", revision), ("license_class", cls),
                            ("license_decision", dec), ("spdx_expression", expr),
                            ("content_sha256", hashlib.sha256(r.text.encode("utf-8")).hexdigest()), ("text", r.text)):
            cols[name].append(value)
    table = pa.table(cols, schema=SCRUBBED_SCHEMA)
    figures = {"files_in": kept.num_rows, "files_out": table.num_rows,
               "refused_by_license": kept.num_rows - table.num_rows - len(leaking),
               "dropped_by_rescan": len(leaking), "dropped_by_rescan_files": leaking[:SAMPLES],
               "redactions": dict(sorted(counts.items())), "samples": samples}
    return Result({"scrubbed": table}, figures)


def no_refused_license_downstream(g):
    """No file with a ``refuse`` license decision reaches the scrubbed output."""
    decisions = g.read("scrubbed", columns=["license_decision"]).column("license_decision").to_pylist()
    refused = sum(1 for d in decisions if d == "refuse")
    return refused == 0, f"{refused} refused files in the output"


def rescan_finds_nothing(g):
    """The committed scrubbed texts, re-read and re-scanned, hold no leak (fail closed)."""
    t = g.read("scrubbed", columns=["doc_key", "text"])
    leaking = [k for k, text in zip(t.column("doc_key").to_pylist(), t.column("text").to_pylist()) if scrub.find_leaks(text)]
    return not leaking, f"{len(leaking)} files with leaks after scrub" + (f", first {leaking[0]}" if leaking else "")


STAGE = Stage(
    name="scrub", asset="scrubbed_files", partitioning=Partitioning.REVISION_SHARD, compute=compute, code_version="3",
    description="Stage 3: PII and secret scrub of license-accepted files; fail-closed re-scan.",
    inputs=(catalog.QUALITY_KEPT, catalog.LICENSE, catalog.SHARD_PLAN), outputs=(catalog.SCRUBBED,),
    gates=(no_refused_license_downstream, rescan_finds_nothing),
    figures=("files_in", "files_out", "refused_by_license", "dropped_by_rescan", "dropped_by_rescan_files", "redactions",
             "samples"),
)
