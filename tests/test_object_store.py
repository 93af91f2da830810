"""A data root on a real object store (moto's S3 server on 127.0.0.1): the whole ``tiny``
snapshot through the CLI, byte-identical to the local run, read back by the verify gate."""

from __future__ import annotations

import hashlib

import pytest

from megacpp_core.storage import DataRoot, MissingOutputError, StorageError

pytestmark = pytest.mark.integration

#: Outputs that carry wall-clock seconds (figures and the card's timing table) or the
#: manifest's own path differ between any two runs; everything else must be identical.
NONDETERMINISTIC = ("figures/", "card.md")


def _hashes_local(root) -> dict[str, str]:
    base = root / "snapshots" / "tiny"
    return {p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(base.rglob("*")) if p.is_file()}


def _hashes_remote(url: str) -> dict[str, str]:
    root = DataRoot(url)
    keys = root.list("snapshots/tiny")
    return {k[len("snapshots/tiny/"):]: root.sha256(k) for k in keys}


def test_tiny_on_s3_is_byte_identical_to_the_local_run(tiny_run, tiny_s3):
    local = {k: v for k, v in _hashes_local(tiny_run[0]).items() if not k.startswith(NONDETERMINISTIC)}
    remote = {k: v for k, v in _hashes_remote(tiny_s3[0]).items() if not k.startswith(NONDETERMINISTIC)}
    assert sorted(remote) == sorted(local)
    assert {"packed/_SUCCESS", "megatron/tiny_text_document.bin", "megatron/tiny_text_document.idx",
            "tokenizer/tokenizer.json", "revisions/lz4-4.4.5/shards/000/scrubbed.parquet"} <= set(remote)
    assert not [k for k in remote if ".tmp-" in k], "a temporary key was left behind"
    differ = sorted(k for k in local if local[k] != remote[k])
    assert not differ, f"S3 outputs differ from the local run: {differ}"
    root = DataRoot(tiny_s3[0])
    assert "Dataset card" in root.read_text("snapshots/tiny/card.md")


def test_verify_reads_the_object_store(tiny_s3, capsys):
    from megacpp_assets.cli import main

    url = tiny_s3[0]
    assert main(["verify", f"{url}/snapshots/tiny/packed"]) == 0
    assert main(["verify", f"{url}/snapshots/tiny/megatron/tiny_text_document"]) == 0
    out = capsys.readouterr().out
    assert "OK s3://" in out and "verify" in out and "first 64 tokens" in out
    assert main(["verify", f"{url}/snapshots/tiny/nothing-here"]) == 2


def test_a_second_run_on_s3_is_current(tiny_s3, s3_env):
    import os
    import subprocess
    import sys

    from tests.conftest import PROJECT, SHARED_CACHE

    url, home = tiny_s3
    env = {**os.environ, **s3_env, "DAGSTER_HOME": str(home), "MEGACPP_CACHE_DIR": str(SHARED_CACHE)}
    r = subprocess.run([sys.executable, "-m", "megacpp_assets.cli", "run", "--corpus", "tiny", "--data-root", url],
                       cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # per revision, one "(current; skipped)" line in each pass: pass 1's own assets (before
    # its shards), pass 2's repo and structure documents (after its shards)
    assert r.stdout.count("(current; skipped)") == 2 * 3 and r.stdout.count("[snapshot] tiny: ") == 2
    assert r.stdout.count("current; skipped") == 2 * 3 + 2 * 3 + 2  # revisions and their shards in both passes, snapshot steps
    assert r.stdout.count("shards 1 of 1 current; skipped") == 2 * 3


def test_atomic_writes_and_clear_errors_on_s3(s3_env):
    import pyarrow as pa

    root = DataRoot("s3://megacpp-data/atomic")
    t = pa.table({"a": list(range(1000))})
    w = root.write_table("x/t.parquet", t)
    assert root.list("x") == ["x/t.parquet"] and root.sha256("x/t.parquet") == w.sha256

    class Boom(Exception):
        pass

    with pytest.raises(Boom):  # a writer that dies mid-way leaves neither the key nor a temporary key
        with root._atomic("x/half.bin") as sink:
            sink.write(b"0" * 100)
            raise Boom()
    assert root.list("x") == ["x/t.parquet"]
    with pytest.raises(MissingOutputError, match="s3://megacpp-data/atomic/x/none.parquet: missing"):
        root.read_table("x/none.parquet")
    with pytest.raises(StorageError, match="not a path inside the data root"):
        root.write_bytes("../escape", b"")
    with pytest.raises(StorageError, match="no fsspec backend for nosuch://"):
        DataRoot("nosuch://bucket/prefix")


@pytest.mark.parametrize("url, extra", [("gs://bucket/prefix", "gcsfs"), ("az://container/prefix", "adlfs")])
def test_other_object_stores_take_the_same_path(url, extra):
    """gs:// and az:// go through the same fsspec layer; without their backend installed
    (the ``gcs`` / ``azure`` extras) the error names the package to install."""
    import importlib.util

    if importlib.util.find_spec(extra) is None:
        with pytest.raises(StorageError, match=f"install {extra}"):
            DataRoot(url)
    else:
        assert DataRoot(url).uri("snapshots/x/a.parquet") == f"{url}/snapshots/x/a.parquet"


def test_another_clients_writes_are_seen(s3_env):
    """What another pod writes is visible at once: listings are not served from this
    process's cache (reads, existence, globs)."""
    import boto3

    root = DataRoot("s3://megacpp-data/peers")
    root.write_json("snapshots/s/a/old.json", {"x": 1})
    assert root.list("snapshots") == ["snapshots/s/a/old.json"] and root.glob("snapshots/*/manifest.yaml") == []
    other = boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL_S3"])
    other.put_object(Bucket="megacpp-data", Key="peers/snapshots/s/a/new.json", Body=b'{"y": 2}')
    other.put_object(Bucket="megacpp-data", Key="peers/snapshots/s/manifest.yaml", Body=b"name: s\n")
    assert root.read_json("snapshots/s/a/new.json") == {"y": 2}
    assert root.exists("snapshots/s/a/new.json")
    assert root.glob("snapshots/*/manifest.yaml") == ["snapshots/s/manifest.yaml"]
    assert "snapshots/s/a/new.json" in root.list("snapshots/s")


def test_file_urls_are_local_paths(tmp_path):
    from megacpp_core.storage import local_location

    assert local_location(f"file://{tmp_path}/x") == str(tmp_path / "x")
    assert DataRoot(f"file://{tmp_path}/x").is_local and DataRoot(f"file://{tmp_path}/x").url == str(tmp_path / "x")
    assert local_location("s3://b/p") is None


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_version_token_changes_when_the_object_is_replaced_or_rewritten(where, s3_env, tmp_path):
    """:meth:`DataRoot.version`: the same token while an object is untouched; another after
    it is replaced (an atomic write) or rewritten in place with bytes of the same size;
    ``None`` for a missing key."""
    import time

    from tests.conftest import S3_BUCKET

    root = DataRoot(str(tmp_path / "root")) if where == "local" else DataRoot(f"s3://{S3_BUCKET}/version-{tmp_path.name}")
    root.write_bytes("a/tok.json", b"first version")
    v1 = root.version("a/tok.json")
    assert v1 is not None and root.version("a/tok.json") == v1
    time.sleep(1.1 if where == "s3" else 0.01)  # S3's LastModified has 1 s resolution; its ETag changes anyway
    root.write_bytes("a/tok.json", b"other version")  # same size
    v2 = root.version("a/tok.json")
    assert v2 is not None and v2 != v1
    if where == "local":
        with open(root.local_path("a/tok.json"), "r+b") as f:  # in place, same inode and size
            f.write(b"OTHER")
        assert root.version("a/tok.json") not in (None, v2)
    assert root.version("a/missing.json") is None


@pytest.mark.parametrize("where", ["local", "s3"])
def test_sizes_lists_every_files_bytes_under_a_prefix(where, s3_env, tmp_path):
    """:meth:`DataRoot.sizes`: ``{key: bytes}`` of every file under a prefix, nested ones
    and empty ones included, nothing outside it; ``{}`` for a prefix with nothing, on a
    local root and on S3 alike."""
    from tests.conftest import S3_BUCKET

    root = DataRoot(str(tmp_path / "root")) if where == "local" else DataRoot(f"s3://{S3_BUCKET}/size-{tmp_path.name}")
    root.write_bytes("a/b.bin", b"x" * 1234)
    root.write_bytes("a/c/d.bin", b"y" * 7)
    root.write_bytes("a/empty.bin", b"")
    root.write_bytes("ab/outside.bin", b"z")
    assert root.sizes("a/") == {"a/b.bin": 1234, "a/c/d.bin": 7, "a/empty.bin": 0}
    assert root.sizes("nothing/") == {}


def test_later_stages_read_and_hash_the_tokenizer_once_until_it_changes(tiny_run, tmp_path, monkeypatch):
    """``snapshot_tokenizer.load``: a second load of an untouched ``tokenizer.json`` reads
    nothing; a file replaced with other bytes is read again and refused against its
    manifest (fail closed), and the original is accepted again once restored."""
    import shutil

    from megacpp_core import snapshot_tokenizer, storage
    from megacpp_core.manifest import load_manifest
    from megacpp_core.stage import Partition
    from megacpp_core.stages import STAGES
    from megacpp_core.runner import StageContext
    from megacpp_core.tokenizer import TokenizerMismatchError

    src = tiny_run[0] / "snapshots" / "tiny"
    dst = tmp_path / "root" / "snapshots" / "tiny"
    shutil.copytree(src / "tokenizer", dst / "tokenizer")
    shutil.copy(src / "manifest.yaml", dst / "manifest.yaml")
    root = storage.open_root(str(tmp_path / "root"))
    manifest = load_manifest(str(dst / "manifest.yaml"))
    stage = next(s for s in STAGES if s.name == "tokenize")
    source = manifest.sources[0].name
    ctx = StageContext(stage, root, manifest, Partition(manifest.name, source, "000"))
    reads: list[str] = []
    real = storage.DataRoot.read_bytes
    monkeypatch.setattr(storage.DataRoot, "read_bytes", lambda self, key: (reads.append(key), real(self, key))[1])
    snapshot_tokenizer._READ.clear()
    tok, info = snapshot_tokenizer.load(ctx)
    assert [k for k in reads if k.endswith("tokenizer.json")] == ["snapshots/tiny/tokenizer/tokenizer.json"]
    again, _ = snapshot_tokenizer.load(ctx)
    assert again is tok and len([k for k in reads if k.endswith("tokenizer.json")]) == 1
    good = (dst / "tokenizer" / "tokenizer.json").read_bytes()
    root.write_bytes("snapshots/tiny/tokenizer/tokenizer.json", good.replace(b'"<UNK>"', b'"<unk>"', 1))
    with pytest.raises(TokenizerMismatchError):
        snapshot_tokenizer.load(ctx)
    root.write_bytes("snapshots/tiny/tokenizer/tokenizer.json", good)
    assert snapshot_tokenizer.load(ctx)[0] is tok
    assert len([k for k in reads if k.endswith("tokenizer.json")]) == 3
