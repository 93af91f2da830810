"""libclang lane, step 1 — the revision's compile command database (SPEC §4, optional layer 5).

Per repo revision; a no-op unless ``settings.semantic_graph``. Input: ``source_files``.
Output: ``compile_commands`` — the shipped ``compile_commands.json`` made relative to the
tree, or one synthesized from the file tree (language and standard by extension, include
roots), with its revision and inputs' sha256 (:mod:`megacpp_core.compile_commands`).
Nothing from the corpus runs.
"""

from __future__ import annotations

from .. import acquire, catalog, compile_commands
from ..stage import Partitioning, Result, Stage


def revision_files(refs) -> tuple[list[tuple[str, bytes]], str]:
    """Every file of a revision as ``(path, bytes)`` and its revision id, from its
    ``source_files`` shards (:func:`megacpp_core.acquire.tree_files`)."""
    return acquire.tree_files(acquire.revision_table(refs, ["path", "content", "revision"]))


def compute(ctx) -> Result:
    files, revision = revision_files(ctx.inputs("source_files"))
    db = compile_commands.build_database(files, revision)
    figures = {"enabled": True, "shipped": db.shipped, "shipped_path": db.shipped_path, "entries": len(db.entries),
               "inputs_sha256": db.inputs_sha256, "revision": revision,
               "database": {k: v for k, v in sorted(db.figures.items()) if isinstance(v, (int, float, str, bool))}}
    return Result({"compile_commands": db.to_json()}, figures)


def database_current(g):
    """The committed database parses and was built for this revision from these inputs."""
    files, revision = revision_files(g.inputs("source_files"))
    try:
        db = compile_commands.load_database(g.output("compile_commands").read_text(), files, revision)
    except ValueError as e:  # StaleDatabaseError is a ValueError
        return False, str(e)
    return True, f"{len(db.entries)} entries for revision {revision[:12]}, inputs {db.inputs_sha256[:12]}"


STAGE = Stage(
    name="compile_commands", asset="compile_commands", partitioning=Partitioning.REVISION, compute=compute,
    code_version="1", kinds=("json",),
    description="libclang lane: the revision's compile command database — the shipped compile_commands.json made "
                "relative to the tree, or one synthesized from the file tree (nothing from the corpus runs); no-op "
                "unless settings.semantic_graph.",
    inputs=(catalog.SOURCE_FILES,), outputs=(catalog.COMPILE_COMMANDS,), settings=("semantic_graph",),
    enabled="semantic_graph", gates=(database_current,),
    figures=("enabled", "shipped", "shipped_path", "entries", "inputs_sha256", "revision", "database"),
)
