"""Layering as a checked contract (import-linter, run by ``make test`` too), zero import
cycles across the four packages, and no oversized module in the domain library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

from tests.conftest import PROJECT

PACKAGES = ("megacpp_core", "megacpp_assets", "megacpp_resources", "megacpp_checks")
#: The longest module the domain library may hold (lines).
MAX_CORE_LINES = 600


def _lint_imports(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--no-cache", *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_import_linter_contracts_hold():
    r = _lint_imports(PROJECT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "5 kept, 0 broken" in r.stdout


def test_the_contract_catches_a_violation(tmp_path):
    """The same kind of contract, on a throwaway package that imports Dagster from its core."""
    pkg = tmp_path / "fakecore"
    (pkg / "stages").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stages" / "__init__.py").write_text("")
    (pkg / "stages" / "a.py").write_text("from fakecore.stages import b\n")
    (pkg / "stages" / "b.py").write_text("import dagster\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = fakecore\ninclude_external_packages = True\n\n"
        "[importlinter:contract:core]\nname = core never imports dagster\ntype = forbidden\n"
        "source_modules = fakecore\nforbidden_modules = dagster\n\n"
        "[importlinter:contract:stages]\nname = stages independent\ntype = independence\nmodules = fakecore.stages.*\n")
    import os

    r = _lint_imports(tmp_path, "--config", str(tmp_path / ".importlinter"),
                      env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 1 and "0 kept, 2 broken" in r.stdout, r.stdout[-2000:]


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in graph.modules:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_zero_import_cycles_across_all_packages():
    graph = grimp.build_graph(*PACKAGES)
    assert len(graph.modules) > 60
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_planted_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyc import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles(grimp.build_graph("cyc", cache_dir=None)) == [["cyc.a", "cyc.b"]]


def test_pipeline_module_is_gone_and_core_modules_are_small():
    core = PROJECT / "megacpp_core"
    assert not (core / "pipeline.py").exists()
    sizes = {p.relative_to(PROJECT).as_posix(): len(p.read_text().splitlines()) for p in core.rglob("*.py")}
    over = {k: v for k, v in sizes.items() if v > MAX_CORE_LINES}
    assert not over, f"modules over {MAX_CORE_LINES} lines: {over}"


def test_every_stage_is_one_module_registered_once():
    from megacpp_core import stages

    modules = {p.stem for p in (PROJECT / "megacpp_core" / "stages").glob("*.py") if p.stem != "__init__"}
    # a compute bound with functools.partial (lsh_bands: one per band range) names its module through .func
    declared = {getattr(s.compute, "func", s.compute).__module__.rsplit(".", 1)[-1] for s in stages.STAGES}
    assert modules == declared
    assert len({s.asset for s in stages.STAGES}) == len(stages.STAGES) == len({s.name for s in stages.STAGES})
