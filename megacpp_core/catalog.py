"""The data catalog: every dataset a stage writes and a later stage may read.

Each :class:`~megacpp_core.stage.Dataset` names its key template under
``snapshots/SNAPSHOT/`` and, for tables, the pandera schema (:mod:`megacpp_checks.schemas`)
its rows must satisfy — the generated ``<name>_schema`` blocking check. Stage modules
declare their inputs and outputs from this catalog; a stage reads only what it declared
(the runner refuses anything else), so the catalog plus the stage declarations are the
whole lineage of the asset graph. Later stages never read an earlier stage's figures.
"""

from __future__ import annotations

from megacpp_checks.schemas import acquire as s_acquire
from megacpp_checks.schemas import chunk_dedup as s_chunk_dedup
from megacpp_checks.schemas import dedup as s_dedup
from megacpp_checks.schemas import documents as s_documents
from megacpp_checks.schemas import license as s_license
from megacpp_checks.schemas import minhash as s_minhash
from megacpp_checks.schemas import quality as s_quality
from megacpp_checks.schemas import scrub as s_scrub
from megacpp_checks.schemas import semantic as s_semantic
from megacpp_checks.schemas import tokenizer as s_tokenizer

from . import families
from .stage import Dataset, Kind, Partitioning

REV = Partitioning.REVISION
SHARD = Partitioning.REVISION_SHARD
SNAP = Partitioning.SNAPSHOT

# ---------------------------------------------------------------- per revision (stage 0, lane)
SHARD_PLAN = Dataset("shard_plan", REV, "revisions/{source}/shards.json", kind=Kind.JSON,
                     description="the revision's shards: count, shard_bytes, files and bytes per shard (megacpp_core.sharding)")
LICENSE_TEXTS = Dataset("license_texts", REV, "revisions/{source}/license_texts.parquet",
                        description="the revision's license files (LICENSE, COPYING, debian/copyright, …) as raw bytes: "
                                    "the tree-level evidence every shard's license scan reads")

# ---------------------------------------------------------------- per revision × shard (stages 0-4a)
SOURCE_FILES = Dataset("source_files", SHARD, "revisions/{source}/shards/{shard}/source_files.parquet",
                       schema=s_acquire.validate_source_files,
                       description="one row per file of the shard: provenance, path, size, sha256, language, raw bytes")
QUALITY_KEPT = Dataset("quality_kept", SHARD, "revisions/{source}/shards/{shard}/quality_kept.parquet",
                       schema=s_quality.validate_kept,
                       description="one row per file kept by the quality filters, with its decoded text")
EXCLUSIONS = Dataset("exclusions", SHARD, "revisions/{source}/shards/{shard}/exclusions.parquet",
                     schema=s_quality.validate_exclusions,
                     description="one row per rejected file: the filter, the measured value and the threshold")
LICENSE = Dataset("license", SHARD, "revisions/{source}/shards/{shard}/license.parquet", schema=s_license.validate_license,
                  description="one row per kept file: SPDX expression, class, decision, reason, origin")
SCRUBBED = Dataset("scrubbed", SHARD, "revisions/{source}/shards/{shard}/scrubbed.parquet", schema=s_scrub.validate_scrubbed,
                   description="one row per license-accepted file with its scrubbed text, content sha256 and license provenance")
MINHASH = Dataset("minhash", SHARD, "revisions/{source}/shards/{shard}/minhash.parquet", schema=s_minhash.validate_signatures,
                  description="one MinHash signature (num_perm uint32) per scrubbed file")

# ---------------------------------------------------------------- per revision × shard (stages 6, 8)
CHUNKS = Dataset("chunks", SHARD, "revisions/{source}/shards/{shard}/chunks.parquet", schema=s_documents.validate_documents,
                 description="the shard's kept files cut into documents within exact token budgets, with "
                             "character-level enrichment, in keep order")
TOKENIZED = Dataset("tokenized", SHARD, "revisions/{source}/shards/{shard}/tokenized.parquet",
                    schema=s_documents.validate_tokenized_documents,
                    description="BOS + uint32 ids per document of the shard with token-aligned enrichment")

# ---------------------------------------------------------------- per revision (the libclang lane)
COMPILE_COMMANDS = Dataset("compile_commands", REV, "revisions/{source}/compile_commands.json", kind=Kind.TEXT,
                           description="the revision's compile command database (shipped or synthesized) with its inputs' sha256")
SEMANTIC_EDGES = Dataset("semantic_edges", REV, "revisions/{source}/semantic_edges.parquet", schema=s_semantic.validate_edges,
                         description="libclang USR-resolved call/type/include edges, with the file unit of each end")
BUILD_INFO = Dataset("build_info", REV, "revisions/{source}/build_info.parquet", schema=s_semantic.validate_build_info,
                     description="one row per translation unit: arguments, status, diagnostics, seconds, RSS")

# ---------------------------------------------------------------- per snapshot (stages 4b-10)
LSH_PAIRS = {(lo, hi): Dataset(f"lsh_pairs_{lo:02d}_{hi:02d}", SNAP, f"dedup/lsh_bands_{lo:02d}_{hi:02d}.parquet",
                               schema=s_minhash.validate_pairs, schema_file=s_minhash.validate_pairs_file,
                               description=f"cross-source LSH candidate pairs of bands {lo}-{hi - 1}, as rows of the "
                                           "concatenated minhash inputs")
             for lo, hi in ((0, 7), (7, 14))}
DECISIONS = Dataset("decisions", SNAP, "dedup/decisions.parquet", schema=s_dedup.validate_decisions_table,
                    schema_file=s_dedup.validate_decisions_file,
                    description="one keep/drop decision per file entering dedup; a drop names its kept twin")
DUPLICATE_CLUSTERS = Dataset("duplicate_clusters", SNAP, "dedup/duplicate_clusters.parquet", schema=s_dedup.validate_clusters,
                             schema_file=s_dedup.validate_clusters_file,
                             description="one row per member of a duplicate cluster, with the kept member")
TOKENIZER = Dataset("tokenizer", SNAP, "tokenizer/tokenizer.json", kind=Kind.TEXT,
                    description="the HuggingFace tokenizers file of the snapshot tokenizer")
TOKENIZER_MANIFEST = Dataset("tokenizer_manifest", SNAP, "tokenizer/tokenizer_manifest.json", kind=Kind.JSON,
                             description="the tokenizer's sha256, vocabulary size and band layout")
TOKENIZER_SAMPLE_IDS = Dataset("tokenizer_sample_ids", SNAP, "tokenizer/sample_ids.parquet",
                               schema=s_tokenizer.validate_sample_ids,
                               description="the ids (uint32, no BOS) of every file the tokenizer trained on, as its "
                                           "round-trip gate encoded them, by doc_key with the text's sha256: the chunk "
                                           "and p3_repo stages take them instead of encoding those files again")
CHUNK_DROPS = Dataset("chunk_drops", SNAP, "documents/chunk_drops.parquet", schema=s_chunk_dedup.validate_drops,
                      description="one row per dropped whitelisted chunk with its kept twin (decided on hashes; "
                                  "the pack and format stages leave these documents out)")
PACKED = Dataset("packed", SNAP, "packed", kind=Kind.SHARDS,
                 description="packed-row parquet shards (train-*, validation-*) and the _SUCCESS sentinel (SPEC §6)")
MEGATRON = Dataset("megatron", SNAP, "megatron", kind=Kind.FILES, marker="{snapshot}_text_document.json",
                   description="Megatron .bin/.idx, the sidecar (written last), the documents parquet and the tokenizer (SPEC §7)")

# ---------------------------------------------------------------- curriculum families (SPEC §5b)
#: Each family's documents: per revision × shard for the phase-1 and phase-2 families (built
#: from the shard's tokenized documents), per revision for ``p3_repo`` (a revision's files)
#: and ``p4_structure`` (the ``p3_repo`` documents with their planes and chunk graph).
FAMILY_DOCUMENTS = {
    f.name: (Dataset(f"{f.name}_documents", REV, f"revisions/{{source}}/families/{f.name}.parquet",
                     schema=s_documents.family_validator(f.row_length),
                     schema_file=s_documents.family_file_validator(f.row_length),
                     description=f"one row per {f.name} document ({f.documents}): BOS + uint32 ids, text, provenance")
             if f.phase >= 3 else
             Dataset(f"{f.name}_documents", SHARD, f"revisions/{{source}}/shards/{{shard}}/families/{f.name}.parquet",
                     schema=s_documents.family_validator(f.row_length),
                     description=f"one row per {f.name} document of the shard ({f.documents}): BOS + uint32 ids, text"))
    for f in families.FAMILIES
}
#: Each family's packed rows (``_SUCCESS`` last) and Megatron dataset (sidecar last).
FAMILY_PACKED = {name: Dataset(f"{name}_packed", SNAP, f"families/{name}/packed", kind=Kind.SHARDS,
                               description=f"{name} packed-row parquet shards and the _SUCCESS sentinel (SPEC §6)")
                 for name in FAMILY_DOCUMENTS}
FAMILY_MEGATRON = {name: Dataset(f"{name}_megatron", SNAP, f"families/{name}/megatron", kind=Kind.FILES,
                                 marker=f"{{snapshot}}_{name}_text_document.json",
                                 description=f"{name} Megatron .bin/.idx, sidecar (last), documents parquet, tokenizer")
                   for name in FAMILY_DOCUMENTS}
#: Per specialist and phase, Megatron's ``--data-path`` list over the family prefixes
#: (``SPECIALIST/phaseN.txt``) and ``index.json`` (written last).
BLENDS = Dataset("blends", SNAP, "blends", kind=Kind.FILES, marker="index.json",
                 description="per specialist and curriculum phase, the Megatron --data-path weight/prefix list over the "
                             "family datasets (SPECIALIST/phaseN.txt; prefixes relative to the snapshot) and index.json")
