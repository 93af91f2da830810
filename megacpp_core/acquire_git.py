"""Stage 0 for ``git`` sources: a shallow fetch of one **tag** with the ``git`` CLI (SPEC §3).

The tag is resolved with ``git ls-remote``; a name that is only a branch, or that does
not exist, is refused. The tag's commit is fetched with ``--depth 1`` into a fresh bare
repository whose hooks directory is empty and with system/global configuration ignored,
and its tree is read with ``git ls-tree``/``git cat-file`` — nothing is checked out, so no
hook, filter, submodule or other code from the repository runs. Submodule entries are
skipped. The tree is stored as a deterministic tar in the content-addressed cache,
``cache/git/COMMIT/tree.tar``, next to ``cache/git/refs/KEY.json`` recording the tag's
resolution and the tar's sha256; a second run reads both without any network access.
The tar is then read (:func:`megacpp_core.acquire.fetch_archive_source`) under the same
rules as any archive, by :class:`megacpp_core.archives.ArchiveReader`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from .archives import AcquireError, _hash_file
from .manifest import Source

#: ``-c`` options on every git call: no hooks, no external transports, no submodules.
_GIT_OPTS = ("-c", "core.hooksPath=/dev/null", "-c", "protocol.ext.allow=never", "-c", "core.fsmonitor=false",
             "-c", "fetch.recurseSubmodules=false", "-c", "submodule.recurse=false", "-c", "advice.detachedHead=false")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


def _git(args: list[str], source: Source, cwd: Path | None = None, input: bytes | None = None) -> bytes:
    try:
        r = subprocess.run(["git", *_GIT_OPTS, *args], cwd=cwd, input=input, capture_output=True, env=_env(), timeout=3600)
    except FileNotFoundError:
        raise AcquireError(f"source {source.name}: the git command is not installed") from None
    if r.returncode != 0:
        raise AcquireError(f"source {source.name}: git {args[0]} failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def resolve_tag(source: Source) -> str:
    """The commit sha the source's tag points to on its remote (``git ls-remote``).

    Raises :class:`AcquireError` when the name is a branch and not a tag, when no such
    tag exists, or when the manifest's ``commit`` differs from the resolution.
    """
    out = _git(["ls-remote", "--tags", "--heads", source.url], source).decode("utf-8", "replace")
    refs = {}
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        refs[ref] = sha
    tag = f"refs/tags/{source.tag}"
    commit = refs.get(tag + "^{}") or refs.get(tag)
    if commit is None:
        if f"refs/heads/{source.tag}" in refs:
            raise AcquireError(f"source {source.name}: {source.tag!r} is a branch of {source.url}, not a tag; "
                               "pin a tag (branches move)")
        raise AcquireError(f"source {source.name}: no tag {source.tag!r} at {source.url}")
    if source.commit and commit != source.commit:
        raise AcquireError(f"source {source.name}: tag {source.tag!r} resolves to {commit}, but the manifest pins commit {source.commit}")
    return commit


def _ref_file(source: Source, cache_root: Path) -> Path:
    key = hashlib.sha256(f"{source.url}\0{source.tag}".encode()).hexdigest()
    return Path(cache_root) / "git" / "refs" / f"{key}.json"


def cached_resolution(source: Source, cache_root: Path) -> dict | None:
    """``{"url", "tag", "commit", "tar", "tar_sha256"}`` when the tag's tree is cached and intact, else None."""
    ref = _ref_file(source, cache_root)
    if not ref.exists():
        return None
    info = json.loads(ref.read_text())
    tar = Path(cache_root) / info["tar"]
    if not tar.exists() or _hash_file(tar) != info["tar_sha256"]:
        return None
    if source.commit and info["commit"] != source.commit:
        return None
    return info


def _tree_tar(repo: Path, commit: str, source: Source) -> tuple[bytes, int]:
    """A deterministic tar of the commit's tree (regular files and symlinks; submodules skipped)."""
    listing = _git(["ls-tree", "-r", "-z", "--full-tree", commit], source, cwd=repo)
    entries = []
    for rec in listing.split(b"\0"):
        if not rec:
            continue
        meta, _, path = rec.partition(b"\t")
        mode, otype, sha = meta.split(b" ")
        entries.append((mode.decode(), otype.decode(), sha.decode(), path))
    blobs = [e for e in entries if e[1] == "blob"]
    skipped = len(entries) - len(blobs)
    out = _git(["cat-file", "--batch"], source, cwd=repo, input=b"".join(e[2].encode() + b"\n" for e in blobs))
    buf = io.BytesIO()
    pos = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tf:
        for mode, _, sha, path in blobs:
            nl = out.index(b"\n", pos)
            header = out[pos:nl].split(b" ")
            size = int(header[2])
            data = out[nl + 1: nl + 1 + size]
            pos = nl + 1 + size + 1
            ti = tarfile.TarInfo(path.decode("utf-8", "surrogateescape"))
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
            if mode == "120000":
                ti.type, ti.linkname = tarfile.SYMTYPE, data.decode("utf-8", "surrogateescape")
                tf.addfile(ti)
            else:
                ti.size, ti.mode = size, 0o755 if mode == "100755" else 0o644
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue(), skipped


def fetch_git(source: Source, cache_root: Path) -> tuple[dict, bool]:
    """Resolve and shallow-fetch the tag; return (cache record, from_cache).

    Raises :class:`AcquireError` for a branch, a missing tag, a commit mismatch or a git failure.
    """
    hit = cached_resolution(source, cache_root)
    if hit:
        return hit, True
    commit = resolve_tag(source)
    cache_root = Path(cache_root)
    (cache_root / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="git-", dir=cache_root / "tmp"))
    try:
        _git(["init", "--bare", "-q", str(work)], source)
        _git(["fetch", "-q", "--depth", "1", "--no-tags", "--no-recurse-submodules", source.url,
              f"+refs/tags/{source.tag}:refs/tags/{source.tag}"], source, cwd=work)
        got = _git(["rev-parse", f"refs/tags/{source.tag}^{{commit}}"], source, cwd=work).decode().strip()
        if got != commit:
            raise AcquireError(f"source {source.name}: tag {source.tag!r} moved while fetching ({commit} then {got})")
        data, skipped = _tree_tar(work, commit, source)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rel = f"git/{commit}/tree.tar"
    tar = cache_root / rel
    tar.parent.mkdir(parents=True, exist_ok=True)
    tmp = tar.with_name(tar.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, tar)
    info = {"url": source.url, "tag": source.tag, "commit": commit, "tar": rel,
            "tar_sha256": hashlib.sha256(data).hexdigest(), "submodules_skipped": skipped}
    ref = _ref_file(source, cache_root)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.with_name(ref.name + ".part").write_text(json.dumps(info, sort_keys=True))
    os.replace(ref.with_name(ref.name + ".part"), ref)
    return info, False
