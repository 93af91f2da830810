"""The dataset card (SPEC §9): a markdown summary of one snapshot, stage by stage.

Rendered from the figures each stage run persisted under ``figures/`` (the card is the
only reader of figures files); written to ``snapshots/SNAPSHOT/card.md`` through the data
root and attached to the ``dataset_card`` asset's metadata.
"""

from __future__ import annotations

import os

from . import families, layout, plots
from .manifest import Manifest
from .storage import DataRoot

REVISION_STAGES = ("acquire", "quality", "license", "scrub", "minhash")
#: The card's plots (:func:`megacpp_core.plots.family_plots`), written as
#: ``plots/NAME.png`` next to ``card.md``, with their titles.
PLOT_TITLES = {"family_document_lengths": "Document length per family", "family_row_fill": "Row fill per family",
               "tokens_per_source": "Tokens per source and per family"}
SNAPSHOT_STAGES = ("dedup", "tokenizer", "chunk", "chunk_dedup", "tokenize", "pack", "format")


def _fmt(n) -> str:
    return f"{n:,}" if isinstance(n, int) else (f"{n:.4g}" if isinstance(n, float) else str(n))


def _add(acc: dict, d: dict) -> None:
    for k, v in d.items():
        acc[k] = acc.get(k, 0) + v


def _pct(x) -> str:
    return f"{100 * float(x or 0):.2f} %"


def dedup_section(d: dict) -> list[str]:
    """Markdown lines of the stage-4 section from the ``dedup`` figures: exact, near and
    cross-source removal counts and rates, the LSH settings with effective thresholds and
    candidate probabilities, and the ten largest clusters with their members."""
    L = ["", "## Stage 4 — dedup", "",
         f"Files in {_fmt(d.get('files_in', 0))} (from {_fmt(d.get('shards_in', 0))} shards); files out {_fmt(d.get('files_out', 0))}. "
         f"Decisions read hashes and signatures; {_fmt(d.get('texts_read_for_verification', 0))} candidate texts were streamed "
         "for the exact-Jaccard verification.", "",
         "| pass | removed | rate | settings |", "|---|---:|---:|---|",
         f"| exact duplicates removed (SHA-256) | {_fmt(d.get('exact_removed', 0))} | {_pct(d.get('exact_removal_rate'))} | across every revision |",
         f"| near, within a source | {_fmt(d.get('near_removed', 0))} | {_pct(d.get('near_removal_rate'))} | MinHash {d.get('num_perm')} "
         f"permutations, {d.get('shingle_k')}-token shingles, Jaccard {d.get('threshold')}, LSH {d.get('lsh_bands')}×{d.get('lsh_rows')}, "
         f"effective threshold {_fmt(d.get('effective_threshold', 0.0))} |",
         f"| cross-source (union-find) | {_fmt(d.get('cross_source_removed', 0))} | {_pct(d.get('cross_source_removal_rate'))} | "
         f"{d.get('cross_num_perm')} permutations, LSH {d.get('cross_lsh_bands')}×{d.get('cross_lsh_rows')}, effective threshold "
         f"{_fmt(d.get('cross_effective_threshold', 0.0))}; {_fmt(d.get('cross_source_clusters', 0))} clusters |"]
    near_p, cross_p = d.get("candidate_probability") or {}, d.get("cross_candidate_probability") or {}
    if near_p:
        L += ["", "LSH candidate probability at Jaccard J (1 − (1 − J^r)^b):", "", "| J | near | cross-source |", "|---:|---:|---:|"]
        L += [f"| {j} | {_fmt(near_p[j])} | {_fmt(cross_p.get(j, 0.0))} |" for j in sorted(near_p)]
    clusters = d.get("largest_clusters") or []
    if clusters:
        L += ["", f"Ten largest duplicate clusters (of {_fmt(d.get('clusters', 0))}; kept member first):", "",
              "| cluster | size | kept | dropped members |", "|---:|---:|---|---|"]
        L += [f"| {c['cluster_id']} | {c['size']} | `{c['kept']}` | {', '.join(f'`{m}`' for m in c['members'])} |" for c in clusters]
    return L


def render_card(root: DataRoot, manifest: Manifest) -> str:
    """Markdown text of the card; missing stage figures are shown as "not materialized"."""
    L: list[str] = [f"# Dataset card — snapshot `{manifest.name}`", ""]
    L += [f"Manifest: `{manifest.path.name}` · settings fingerprint `{manifest.settings.fingerprint()}` · "
          f"row length {manifest.settings.row_length:,} · vocabulary {manifest.settings.vocab_size:,}", ""]
    rev = {st: {s.name: layout.read_figures(root, manifest.name, st, s.name) for s in manifest.sources}
           for st in REVISION_STAGES + ("semantic_graph",)}
    names = [s.name for s in manifest.sources]
    snap = {st: layout.read_figures(root, manifest.name, st, sources=names) for st in SNAPSHOT_STAGES}

    L += ["## Sources", "", "| source | archive sha256 | files | bytes | C/C++ kept | license classes | wall s |",
          "|---|---|---:|---:|---:|---|---:|"]
    for s in manifest.sources:
        a, q, lic = rev["acquire"][s.name] or {}, rev["quality"][s.name] or {}, rev["license"][s.name] or {}
        wall = sum((rev[st][s.name] or {}).get("wall_seconds", 0) for st in REVISION_STAGES)
        classes = ", ".join(f"{k} {v}" for k, v in (lic.get("classes") or {}).items())
        L.append(f"| {s.name} | `{(a.get('archive_sha256') or '')[:12]}…` | {_fmt(a.get('files', 0))} | {_fmt(a.get('bytes', 0))} | "
                 f"{_fmt(q.get('files_out', 0))} | {classes} | {wall:.1f} |")

    rejected: dict = {}
    qin = qout = bin_ = bout = 0
    classes: dict = {}
    decisions: dict = {}
    origins: dict = {}
    redactions: dict = {}
    per_source: list = []
    for s in manifest.sources:
        q = rev["quality"][s.name] or {}
        _add(rejected, q.get("rejected", {}))
        qin += q.get("files_in", 0); qout += q.get("files_out", 0)
        bin_ += q.get("bytes_in", 0); bout += q.get("bytes_out", 0)
        lic = rev["license"][s.name] or {}
        _add(classes, lic.get("classes", {})); _add(decisions, lic.get("decisions", {})); _add(origins, lic.get("origins", {}))
        sc = rev["scrub"][s.name] or {}
        _add(redactions, sc.get("redactions", {}))
        per_source.append(list(sc.get("samples", [])))
    # 20 samples for review, taken round-robin over the sources (manifest order) so one
    # source's many redactions do not crowd out the others
    samples = [lst[i] for i in range(max(map(len, per_source), default=0)) for lst in per_source if i < len(lst)][:20]
    L += ["", "## Stage 1 — quality", "", f"Files in {_fmt(qin)} ({_fmt(bin_)} bytes) → kept {_fmt(qout)} ({_fmt(bout)} bytes). "
          "Every rejected file is listed with its filter and measured value in `revisions/SOURCE/exclusions.parquet`.", "",
          "| filter | rejected |", "|---|---:|"] + [f"| {k} | {_fmt(v)} |" for k, v in rejected.items()]
    L += ["", "## Stage 2 — license", "", "| class | files |", "|---|---:|"] + [f"| {k} | {_fmt(v)} |" for k, v in sorted(classes.items())]
    L += ["", "| decision | files |", "|---|---:|"] + [f"| {k} | {_fmt(v)} |" for k, v in sorted(decisions.items())]
    L += ["", "| decided from | files |", "|---|---:|"] + [f"| {k} | {_fmt(v)} |" for k, v in sorted(origins.items())]
    L += dep5_section(manifest, rev["license"])
    L += ["", "## Stage 3 — scrub", "", "| kind | redactions |", "|---|---:|"] + [f"| {k} | {_fmt(v)} |" for k, v in redactions.items()]
    if samples:
        L += ["", f"{len(samples)} sampled redactions in context, for human review:", ""]
        L += [f"- `{x.get('doc_key')}` ({x.get('kind')}): `{' '.join(str(x.get('before', '')).split())[:160].replace('`', chr(39))}`"
              for x in samples]

    d = snap["dedup"] or {}
    L += dedup_section(d)
    t = snap["tokenizer"] or {}
    L += ["", "## Stage 5 — tokenizer", "",
          f"Vocabulary {_fmt(t.get('vocab_size', 0))}: 64 special, {_fmt(t.get('learned', 0))} learned BPE, "
          f"{_fmt(t.get('reserved', 0))} reserved (the corpus could not supply more merges). sha256 `{t.get('sha256', '')}`."]
    c = snap["chunk"] or {}
    cd = snap["chunk_dedup"] or {}
    L += ["", "## Stages 6–7 — chunking and chunk dedup", "",
          f"{_fmt(c.get('files', 0))} files → {_fmt(c.get('documents', 0))} documents ({_fmt(c.get('files_split', 0))} files split; "
          f"budget {_fmt(c.get('budget_tokens', 0))} tokens + BOS; largest {_fmt(c.get('max_document_tokens', 0))}; "
          f"files with parse errors {_fmt(c.get('parse_error_files', 0))}). Chunk dedup dropped "
          f"{_fmt(sum((cd.get('dropped') or {}).values()))} ({', '.join(f'{k} {v}' for k, v in (cd.get('dropped') or {}).items()) or 'none'}).",
          f"Files with ERROR nodes cut by the brace-balanced splitter: {_fmt(c.get('brace_fallback_files', 0))} "
          f"(fallback rate {_fmt(c.get('brace_fallback_rate', 0.0))}). Buckets: "
          + (", ".join(f"{k} tokens {_fmt(v)}" for k, v in (c.get('buckets') or {}).items()) or "none")
          + f"; documents over their bucket: {_fmt(c.get('documents_over_bucket', 0))}."]
    lane = {name: f for name, f in rev["semantic_graph"].items() if f and f.get("enabled")}
    L += enrichment_section(c, snap["tokenize"] or {}, lane)
    tz, p, f = snap["tokenize"] or {}, snap["pack"] or {}, snap["format"] or {}
    L += ["", "## Stages 8–10 — tokens, rows, Megatron", "",
          f"Tokens (with BOS) {_fmt(tz.get('tokens', 0))} over {_fmt(tz.get('documents', 0))} documents "
          f"({_fmt(tz.get('bytes_per_token', 0.0))} bytes/token).",
          f"Rows {_fmt(p.get('rows', 0))} of {_fmt(p.get('row_length', 0))} tokens (lower bound {_fmt(p.get('rows_lower_bound', 0))}; "
          f"{_fmt(p.get('validation_rows', 0))} validation; rows / lower bound ⌈tokens / L⌉ = {_fmt(p.get('rows_over_lower_bound', 0.0))}); "
          f"padding fraction {_fmt(p.get('padding_fraction', 0.0))}; loss tokens {_fmt(p.get('loss_tokens', 0))}; "
          f"optional columns {', '.join(p.get('optional_columns') or []) or 'none'}.",
          f"FIM (rate {p.get('fim_rate')}, SPM share {p.get('fim_spm_share')}, seed {p.get('fim_seed')}): "
          f"{_fmt(p.get('fim_psm', 0))} PSM, {_fmt(p.get('fim_spm', 0))} SPM, {_fmt(p.get('fim_skipped_too_long', 0))} left whole "
          f"(no room for the markers); doc-comment policy `{p.get('fim_doc_comment_policy')}` masked "
          f"{_fmt(p.get('fim_doc_comment_masked_tokens', 0))} tokens in {_fmt(p.get('fim_doc_comment_docs', 0))} documents.",
          f"Megatron ({f.get('export_level', 'document')}-level): `{f.get('prefix', '')}` — {_fmt(f.get('documents', 0))} sequences, dtype {f.get('dtype', '')}, "
          f"verify {'passed' if f.get('verify_ok') else 'NOT passed'}."]
    fam = family_figures(root, manifest)
    L += families_section(fam, layout.read_figures(root, manifest.name, "family_chunks", sources=names) or {},
                          layout.read_figures(root, manifest.name, "repo_documents", sources=names) or {},
                          layout.read_figures(root, manifest.name, "structure_documents", sources=names) or {},
                          layout.read_figures(root, manifest.name, "blends") or {})
    if any(fam.values()):
        L += ["", "### Plots"] + [x for k, t in PLOT_TITLES.items() for x in ("", f"![{t}](plots/{k}.png)")]
    L += ["", "## Wall time and peak memory per stage", "",
          "Seconds summed over the stage's partitions; peak RSS is the largest of its steps "
          "(one process's VmHWM over compute, commit and gates).", "",
          "| stage | seconds | peak RSS (MB) |", "|---|---:|---:|"]

    def row(name: str, figs: list[dict | None]) -> str:
        figs = [f for f in figs if f]
        rss = [f["max_rss_mb"] for f in figs if isinstance(f.get("max_rss_mb"), (int, float))]
        return (f"| {name} | {sum(f.get('wall_seconds', 0) for f in figs):.1f} | "
                f"{f'{max(rss):,.0f}' if rss else '—'} |")

    for st in REVISION_STAGES:
        L.append(row(f"{st} (all revisions)", [rev[st][s.name] for s in manifest.sources]))
    for st in SNAPSHOT_STAGES:
        L.append(row(st, [snap[st]]))
    for name, f in fam.items():
        if f:
            L.append(row(name, [f]))
    return "\n".join(L) + "\n"


def family_figures(root: DataRoot, manifest: Manifest) -> dict[str, dict | None]:
    """``{family: its stage's figures, or None when not materialized}`` in
    :data:`megacpp_core.families.FAMILIES` order."""
    return {f.name: layout.read_figures(root, manifest.name, f.name) for f in families.FAMILIES}


def families_section(fam: dict[str, dict | None], chunks: dict, repo: dict, structure: dict | None = None,
                     blends: dict | None = None) -> list[str]:
    """Markdown lines of the curriculum families (SPEC §5b): per family its phase, row
    length, documents, tokens, rows, fill and verify outcome, from each family stage's
    figures (``fam``), the phase-1/2 builder's (``chunks``), the phase-3 builder's
    (``repo``) and the phase-4 builder's (``structure``) summed over the snapshot, and the
    blends' (``blends``); a family not materialized is said so."""
    L = ["", "## Curriculum families (SPEC 5b)", "",
         "| family | phase | row length | documents | tokens | rows | fill | rows / lower bound | FIM | Megatron | verify |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for name, f in fam.items():
        if not f:
            L.append(f"| {name} | | | not materialized | | | | | | | |")
            continue
        L.append(f"| {name} | {f.get('phase')} | {_fmt(f.get('row_length', 0))} | {_fmt(f.get('docs', 0))} | "
                 f"{_fmt(f.get('tokens', 0))} | {_fmt(f.get('rows', 0))} | {_pct(f.get('fill'))} | "
                 f"{_fmt(f.get('rows_over_lower_bound', 0.0))} | {'rate ' + str(f.get('fim_rate')) if f.get('fim_rate') else 'off'} | "
                 f"`{f.get('megatron_prefix', '')}` | {'passed' if f.get('verify_ok') else 'NOT passed'} |")
    L += ["", f"Phase 1: {_fmt(chunks.get('p1_split_documents', 0))} documents over 4,096 tokens cut by ids into "
          f"{_fmt(chunks.get('p1_pieces', 0))} pieces (at declaration starts, else line ends); doc-rich = a "
          f"documentation-comment share of at least {families.DOCRICH_MIN_SHARE}. Phase 2: "
          f"{_fmt(chunks.get('p2_whole_files', 0))} whole files, {_fmt(chunks.get('p2_fallback_files', 0))} over 16,384 tokens "
          f"kept as their chunks. Phase 3: {_fmt(repo.get('files', 0))} files in {_fmt(repo.get('pieces', 0))} repository "
          f"pieces ({_fmt(repo.get('multi_file_pieces', 0))} spanning several files; {_fmt(repo.get('includes_resolved', 0))} "
          f"includes resolved); {_fmt(repo.get('oversized_files', 0))} files over 65,536 tokens fell back to their "
          f"p2_file split ({_fmt(repo.get('fallback_documents', 0))} documents)."]
    st = structure or {}
    if st:
        lane = "on" if st.get("semantic_graph") else "off"
        L += ["", f"Phase 4: the {_fmt(st.get('p4_structure_docs', 0))} phase-3 documents with the five planes aligned to "
              f"their tokens and {_fmt(st.get('chunks', 0))} chunks ({_fmt(st.get('call_edges', 0))} call edges, "
              f"{_fmt(st.get('type_edges', 0))} type edges) in their token positions; libclang lane {lane}: "
              f"{_fmt(st.get('cross_file_call_edges', 0))} cross-file call and {_fmt(st.get('cross_file_type_edges', 0))} "
              f"cross-file type edges carried, {_fmt(st.get('lane_edges_across_pieces', 0))} between files of two "
              f"pieces left out; {_fmt(st.get('chunks_without_tokens', 0))} chunks held no token start."]
    if blends:
        L += ["", f"Blends (version {blends.get('blend_version')}): {_fmt(blends.get('blends', 0))} Megatron `--data-path` "
              f"lists, one per specialist and phase, in `blends/SPECIALIST/phaseN.txt` (prefixes relative to the "
              f"snapshot directory; `blends/index.json`)."]
    lengths = {name: f.get("document_lengths") or {} for name, f in fam.items() if f}
    bins = sorted({b for h in lengths.values() for b in h}, key=lambda b: int(b[2:]))
    if bins:
        L += ["", "Document length (tokens with BOS) per family:", "", "| ≤ tokens | " + " | ".join(lengths) + " |",
              "|---:|" + "---:|" * len(lengths)]
        L += [f"| {_fmt(int(b[2:]))} | " + " | ".join(_fmt(h.get(b, 0)) for h in lengths.values()) + " |" for b in bins]
    return L


def dep5_section(manifest: Manifest, license_figures: dict[str, dict | None], limit: int = 20) -> list[str]:
    """Markdown lines comparing ScanCode with each Debian source package's
    ``debian/copyright`` (DEP-5): agreement per package and the disagreements."""
    rows = [(name, (f or {}).get("dep5") or {}) for name, f in license_figures.items()]
    rows = [(name, d) for name, d in rows if d.get("copyright") not in (None, "none")]
    if not rows:
        return []
    L = ["", "### ScanCode against DEP-5 (`debian/copyright`)", "",
         f"For Debian source packages, each kept file's ScanCode decision is compared with the license of its "
         f"`Files:` paragraph; where their classes differ, `license_dep5_policy: "
         f"{manifest.settings.license_dep5_policy}` decides.", "",
         "| source | copyright file | files compared | agree | same class | disagree | DEP-5 only | agreement | decided by DEP-5 |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, d in rows:
        a = d.get("agreement") or {}
        rate = d.get("agreement_rate")
        L.append(f"| {name} | {d.get('copyright')} | {_fmt(d.get('compared', 0))} | {_fmt(a.get('agree', 0))} | "
                 f"{_fmt(a.get('same_class', 0))} | {_fmt(a.get('disagree', 0))} | {_fmt(a.get('dep5_only', 0))} | "
                 f"{_pct(rate) if rate is not None else 'n/a'} | {_fmt(d.get('decided_by_dep5', 0))} |")
    listed = [(name, x) for name, d in rows for x in d.get("disagreements") or []][:limit]
    if listed:
        L += ["", f"Disagreements (first {len(listed)}):", "",
              "| source | path | ScanCode | DEP-5 (pattern) | decided by | class, decision |", "|---|---|---|---|---|---|"]
        L += [f"| {name} | `{x['path']}` | {x.get('scancode') or 'none'} | {x.get('dep5')} (`{x.get('pattern')}`) | "
              f"{x.get('chosen')} | {x.get('class')}, {x.get('decision')} |" for name, x in listed]
    return L


def enrichment_section(c: dict, tz: dict, lane: dict | None = None) -> list[str]:
    """Markdown lines of the enrichment figures (stage 6 and the stage-8 alignment) and of
    the libclang lane (``lane``: the ``semantic_graph`` figures per source)."""
    if not c.get("enrichment"):
        return ["", "## Enrichment", "", "Off for this snapshot (`settings.enrichment: false`; the libclang lane needs it)."]
    share = tz.get("structure_token_share") or {}
    plat = c.get("platform_labels") or {}
    top = sorted((plat.get("per_label") or {}).items(), key=lambda kv: (-kv[1], kv[0]))[:12]
    L = ["", "## Enrichment", "",
         f"Rules {c.get('enrichment_version')}, node-type map {c.get('ast_node_type_map')} "
         f"(`{str(c.get('ast_node_type_map_sha256', ''))[:12]}…`), platform vocabulary {c.get('platform_vocabulary')} "
         f"(`{str(c.get('platform_vocabulary_sha256', ''))[:12]}…`). {_fmt(c.get('chunks', 0))} chunks, "
         f"{_fmt(c.get('call_edges', 0))} call edges, {_fmt(c.get('type_edges', 0))} type edges; "
         f"{_fmt(tz.get('chunks_without_tokens', 0))} chunks held no token start and were dropped at alignment.",
         "", "| StructureCategory | share of tokens |", "|---|---:|"]
    L += [f"| {k} | {_fmt(v)} |" for k, v in share.items()]
    L += ["", f"Platform labels: {_fmt(plat.get('labelled_documents', 0))} of {_fmt(plat.get('documents', 0))} documents "
          f"labelled, {_fmt(plat.get('at_cap', 0))} at the cap of {_fmt(plat.get('max_labels_per_document', 20))}.", "",
          "| label | documents |", "|---|---:|"]
    L += [f"| {k} | {_fmt(v)} |" for k, v in top]
    L += ["", "### libclang semantic graph lane", ""]
    if not c.get("semantic_graph"):
        L.append("Off for this snapshot (`settings.semantic_graph: false`); call and type edges are tree-sitter's.")
        return L
    L += [f"On: {_fmt(c.get('semantic_covered_files', 0))} translation units parsed without a fatal error had their "
          f"tree-sitter edges replaced by libclang's ({_fmt(c.get('documents_with_semantic_edges', 0))} documents).", "",
          "| source | TUs | TU coverage | call coverage | resolved into the tree | edges | timeouts | crashes |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in (lane or {}).items():
        L.append(f"| {name} | {_fmt(f.get('tus') or 0)} | {_fmt(f.get('tu_coverage') or 0.0)} | {_fmt(f.get('call_coverage') or 0.0)} | "
                 f"{_fmt(f.get('call_coverage_tree') or 0.0)} | {_fmt(f.get('edges') or 0)} | {_fmt(f.get('tus_timeout') or 0)} | "
                 f"{_fmt(f.get('tus_crashed') or 0)} |")
    return L


def write_card(root: DataRoot, manifest: Manifest) -> str:
    """Render and write ``snapshots/SNAPSHOT/card.md`` and its plots; return the text."""
    return write_card_and_plots(root, manifest)[0]


def plot_key(snapshot: str, name: str) -> str:
    """Key of one of the card's plots: ``snapshots/SNAPSHOT/plots/NAME.png``."""
    return f"{layout.snapshot_prefix(snapshot)}/plots/{name}.png"


def write_card_and_plots(root: DataRoot, manifest: Manifest) -> tuple[str, dict[str, bytes]]:
    """Render the card and its plots (:data:`PLOT_TITLES`, from the family stages'
    figures; none when no family is materialized), write each PNG to :func:`plot_key`
    and then ``card.md``; return ``(card text, {plot name: PNG bytes})``. The plots are
    drawn on two processes when this one may use two cores (:func:`plots.draw_pngs`)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    images = plots.family_plots(family_figures(root, manifest), processes=min(2, cores))
    for name, data in images.items():
        root.write_bytes(plot_key(manifest.name, name), data)
    text = render_card(root, manifest)
    root.write_text(layout.card_key(manifest.name), text)
    return text, images
