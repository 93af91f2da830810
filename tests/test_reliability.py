"""Reliability of whole runs: SIGKILL inside each kind of stage and a rerun, two runs at
once, damaged outputs, and sources or snapshots with nothing to process."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from megacpp_core.storage import FAULT_KILL_ENV
from tests.conftest import PROJECT, make_data_root

pytestmark = pytest.mark.integration


def _cli(root: Path, home: Path, *args: str, fault: str | None = None, corpus: str = "tiny",
         popen: bool = False):
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop("MEGACPP_DATA_ROOT", None)
    env.pop(FAULT_KILL_ENV, None)
    if fault:
        env[FAULT_KILL_ENV] = fault
    argv = [sys.executable, "-m", "megacpp_assets.cli", "run", "--corpus", corpus, "--data-root", str(root), *args]
    if popen:
        return subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(argv, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=1200)


def _hashes(root: Path, snapshot: str = "tiny") -> dict[str, str]:
    base = root / "snapshots" / snapshot
    return {p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(base.rglob("*"))
            if p.is_file() and not p.relative_to(base).as_posix().startswith(("figures/", "card.md"))}


def test_sigkill_inside_each_kind_of_stage_then_rerun(tiny_run, tmp_path):
    """Killed right before committing an output of a per-revision stage, a snapshot stage,
    the packed shards and the Megatron pair: nothing a reader accepts is left, and a rerun
    finishes byte-identical to an uninterrupted run. One process (``--workers 1``), so the
    kill ends the run itself; a killed worker is the next test."""
    from megacpp_assets.cli import main
    from megacpp_core import pack
    from megacpp_core.loader import PackedRowsDataset

    root, home = make_data_root(tmp_path / "root"), tmp_path / "home"
    snap = root / "snapshots" / "tiny"
    # per revision: scrub of lz4 (pybind11 is done, xxhash not started)
    r = _cli(root, home, "--workers", "1", fault="revisions/lz4-4.4.5/shards/000/scrubbed.parquet")
    assert r.returncode == -9, r.stderr[-2000:]
    assert not (snap / "revisions/lz4-4.4.5/shards/000/scrubbed.parquet").exists()
    assert list((snap / "revisions/lz4-4.4.5/shards/000").glob("scrubbed.parquet.tmp-*"))  # the half-committed file
    assert (snap / "revisions/pybind11-3.1.0/shards/000/scrubbed.parquet").exists() and not (snap / "dedup").exists()
    # second pass: the chunk stage on lz4's shard (after the snapshot's dedup and tokenizer)
    r = _cli(root, home, "--workers", "1", fault="revisions/lz4-4.4.5/shards/000/chunks.parquet")
    assert r.returncode == -9, r.stderr[-2000:]
    assert "(current; skipped)" in r.stdout  # pybind11 was not redone
    assert (snap / "tokenizer/tokenizer.json").exists() and not (snap / "revisions/lz4-4.4.5/shards/000/chunks.parquet").exists()
    assert (snap / "revisions/pybind11-3.1.0/shards/000/chunks.parquet").exists()
    assert not list((snap / "revisions/lz4-4.4.5").rglob("scrubbed.parquet.tmp-*"))  # the rerun of scrub cleaned its leftover
    # the packed shards: the train shard committed, validation and _SUCCESS not (the pack
    # stage's own key: each family writes families/NAME/packed/validation-00000.parquet too)
    r = _cli(root, home, "--workers", "1", fault="snapshots/tiny/packed/validation-00000.parquet")
    assert r.returncode == -9, r.stderr[-2000:]
    assert (snap / "packed/train-00000.parquet").exists() and not (snap / "packed" / pack.SUCCESS).exists()
    with pytest.raises(pack.IncompleteShardsError):
        PackedRowsDataset(snap / "packed")
    assert main(["verify", str(snap / "packed")]) == 1
    # the Megatron write: the .bin is in place, the .idx and the sidecar are not
    r = _cli(root, home, "--workers", "1", fault="megatron/tiny_text_document.idx")
    assert r.returncode == -9, r.stderr[-2000:]
    assert (snap / "megatron/tiny_text_document.bin").exists() and not (snap / "megatron/tiny_text_document.idx").exists()
    assert main(["verify", str(snap / "megatron/tiny_text_document")]) == 1
    # the rerun completes, and its outputs are those of an uninterrupted run
    r = _cli(root, home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [p for p in snap.rglob("*") if ".tmp-" in p.name]
    assert not list((root / ".scratch").iterdir())  # the killed runs' scratch directories were swept
    want = {k: v for k, v in _hashes(tiny_run[0]).items() if k not in ("manifest.origin.json",)}
    got = {k: v for k, v in _hashes(root).items() if k not in ("manifest.origin.json",)}
    assert got == want


def test_a_worker_killed_mid_write_fails_the_run_then_rerun(tiny_run, tmp_path):
    """``--workers 2``: a worker killed right before committing lz4's scrubbed shard ends
    the run with exit 1 and says so; nothing half-written is accepted, and the rerun on 2
    workers finishes byte-identical to the 1-worker session run."""
    root, home = make_data_root(tmp_path / "root"), tmp_path / "home"
    snap = root / "snapshots" / "tiny"
    r = _cli(root, home, "--workers", "2", fault="revisions/lz4-4.4.5/shards/000/scrubbed.parquet")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "megacpp run: worker failed" in r.stderr
    assert not (snap / "revisions/lz4-4.4.5/shards/000/scrubbed.parquet").exists() and not (snap / "dedup").exists()
    r = _cli(root, home, "--workers", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [p for p in snap.rglob("*") if ".tmp-" in p.name]
    # the workers' runs have their progress lines in their step logs (the UI's), as printed
    logs = [p.read_text() for p in (home / "storage").rglob("compute_logs/*.out")]
    chunk_lines = [ln for t in logs for ln in t.splitlines() if re.match(r"\d\d:\d\d:\d\d  chunk +tiny/", ln)]
    assert chunk_lines and all(ln in r.stdout for ln in chunk_lines)
    want = {k: v for k, v in _hashes(tiny_run[0]).items() if k not in ("manifest.origin.json",)}
    got = {k: v for k, v in _hashes(root).items() if k not in ("manifest.origin.json",)}
    assert got == want


def test_two_runs_at_once_serialize(tiny_run, tmp_path):
    """Two ``megacpp run`` on a fresh data root (the Dagster instance does not exist yet):
    the second waits for the first, says so, then finds everything current."""
    root, home = make_data_root(tmp_path / "root"), tmp_path / "home"
    a = _cli(root, home, popen=True)
    b = _cli(root, home, popen=True)
    outs = [p.communicate(timeout=1200) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, [o[1][-2000:] for o in outs]
    assert not any("Traceback" in err for _, err in outs), [err[-2000:] for _, err in outs]
    waited = [err for _, err in outs if "waiting for it to finish" in err]
    assert len(waited) == 1 and "another megacpp run (pid " in waited[0]
    assert _hashes(root) == _hashes(tiny_run[0])


def _manifest(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text("name: empty\nsources:\n" + body)
    return p


def test_a_source_without_c_or_cpp_is_refused_at_stage_0(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# nothing to compile here\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"print('hello')\n"
        info = tarfile.TarInfo("pkg-1.0/setup.py")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    arc = tmp_path / "pkg-1.0.tar.gz"
    arc.write_bytes(buf.getvalue())
    sha = hashlib.sha256(buf.getvalue()).hexdigest()
    for body, name in ((f"  - {{name: hollow, kind: local, path: {empty}, label: v1}}\n", "hollow"),
                       (f"  - {{name: prose, kind: local, path: {docs}, label: v1}}\n", "prose"),
                       (f"  - {{name: pyonly, kind: archive, path: {arc}, sha256: {sha}}}\n", "pyonly")):
        root = make_data_root(tmp_path / f"root-{name}")
        r = _cli(root, tmp_path / f"home-{name}", corpus=str(_manifest(tmp_path, body)))
        assert r.returncode == 1 and f"source {name!r}" in r.stderr and "holds no C/C++ file" in r.stderr, r.stderr[-2000:]
        written = [p for p in (root / "snapshots").rglob("*") if p.is_file() and p.name not in (
            "manifest.yaml", "manifest.origin.json")]
        assert written == [], written


def test_an_empty_kept_set_stops_before_the_tokenizer(tmp_path):
    src = tmp_path / "gpl3"
    src.mkdir()
    notice = ("/* This program is free software: you can redistribute it and/or modify it under the terms of\n"
              " * the GNU General Public License as published by the Free Software Foundation, either version 3\n"
              " * of the License, or (at your option) any later version. */\n")
    for i in range(3):
        (src / f"f{i}.c").write_text(notice + "".join(f"int f{i}_{k}(int x) {{ return x * {k} + {i}; }}\n"
                                                      for k in range(20)))
    root = make_data_root(tmp_path / "root")
    r = _cli(root, tmp_path / "home", corpus=str(_manifest(tmp_path, f"  - {{name: gpl3, kind: local, path: {src}, label: v1}}\n")))
    assert r.returncode == 1 and "the kept set is empty" in r.stderr and "'empty'" in r.stderr, r.stderr[-2000:]
    assert not (root / "snapshots/empty/tokenizer").exists() or not any((root / "snapshots/empty/tokenizer").iterdir())


def test_a_flipped_payload_byte_fails_verify(tiny_run, tmp_path, capsys):
    """A byte changed inside the .bin that keeps every id in range is caught by the
    sha256 the sidecar records."""
    import numpy as np

    from megacpp_assets.cli import main

    src = tiny_run[0] / "snapshots" / "tiny" / "megatron"
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    binf = tmp_path / "tiny_text_document.bin"
    tokens = np.fromfile(binf, dtype=np.int32)
    i = len(tokens) // 2
    tokens[i] = 3 if tokens[i] != 3 else 4  # another valid id
    tokens.tofile(binf)
    assert main(["verify", str(tmp_path / "tiny_text_document")]) == 1
    out = capsys.readouterr().out
    assert "[sha256]" in out and "tiny_text_document.bin" in out
    assert "[token-range]" not in out  # the id is in range: only the checksum sees it


@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_the_loader_names_a_damaged_shard(tiny_run, tmp_path, damage):
    from megacpp_core.loader import LoaderError, PackedRowsDataset

    shutil.copytree(tiny_run[0] / "snapshots" / "tiny" / "packed", tmp_path / "packed")
    shard = tmp_path / "packed" / "train-00000.parquet"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 3: len(data) // 3 + 4096] = bytes(4096)
    shard.write_bytes(bytes(data))
    with pytest.raises(LoaderError, match=str(shard).replace(".", r"\.")):
        PackedRowsDataset(tmp_path / "packed")
