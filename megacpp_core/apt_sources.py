"""A private apt configuration for Debian source packages, derived from the machine's own.

Nothing in the machine's ``/etc/apt`` or ``/var/lib/apt`` is modified:
:func:`private_apt_config` derives one ``Types: deb-src`` entry from every ``deb`` entry
the machine is configured with (same URIs, suites, components and options such as
``Signed-By``) and writes it, with its own state, cache and log directories, under the
content cache; :func:`apt_update`, :func:`source_versions` and :func:`locate_version`
run apt under it. No mirror or registry host appears in this code: every URI comes from
the machine's configuration. See :mod:`megacpp_core.acquire_debian` for the whole kind.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .archives import AcquireError
from .debian_source import Dsc, DscFormatError, _files_from_paragraph
from .manifest import Source

log = logging.getLogger("megacpp.acquire.debian")

#: Re-run ``apt-get update`` for a version that is not found only when the indexes are
#: older than this many seconds (one hour); a fresh index that lacks it is final.
REFRESH_AFTER_S = 3600
#: Seconds allowed for one apt call (update, showsrc, source download).
APT_TIMEOUT_S = 3600
#: Tarball compressions a source package may use: dpkg's compressor extensions
#: One-line ``sources.list`` option names → deb822 field names (sources.list(5), "THE DEB
#: AND DEB-SRC TYPES: OPTIONS"); options that only concern binary indexes are dropped.
_ONE_LINE_OPTIONS = {
    "signed-by": "Signed-By", "trusted": "Trusted", "check-valid-until": "Check-Valid-Until",
    "valid-until-min": "Valid-Until-Min", "valid-until-max": "Valid-Until-Max", "check-date": "Check-Date",
    "date-max-future": "Date-Max-Future", "inrelease-path": "InRelease-Path", "pdiffs": "PDiffs",
    "by-hash": "By-Hash", "allow-insecure": "Allow-Insecure", "allow-weak": "Allow-Weak",
    "allow-downgrade-to-insecure": "Allow-Downgrade-To-Insecure", "snapshot": "Snapshot",
}
_BINARY_ONLY_OPTIONS = ("arch", "lang", "target", "architectures", "languages", "targets")
#: deb822 fields that describe the entry itself rather than an option carried over.
_ENTRY_FIELDS = ("types", "uris", "suites", "components", "enabled")
#: Machine ``Acquire::`` settings not carried into the private configuration (index
#: targets and changelog locations are apt's compiled-in defaults or binary-index add-ons).
_NOT_CARRIED = ("Acquire::IndexTargets", "Acquire::Changelogs", "Acquire::cdrom")


class AptMissingError(AcquireError):
    """``apt-get`` (or ``apt-cache``) is not installed on this machine."""

    field = "kind"


class AptConfigError(AcquireError):
    """The machine's apt configuration has no ``deb`` entry to derive ``deb-src`` from."""

    field = "kind"


class AptError(AcquireError):
    """An apt call failed for another reason (network, signature, lock); stderr is quoted."""

    field = "package"


class DebianVersionNotFoundError(AcquireError):
    """The package, or the pinned version of it, is not in the configured suites."""

    field = "version"


# --------------------------------------------------------------------------- machine apt configuration


@dataclass(frozen=True)
class AptEntry:
    """One ``deb`` entry of the machine's configuration.

    ``uris``, ``suites``, ``components`` as configured (``components`` empty for a flat
    repository); ``options``: ``(deb822 field, value)`` pairs carried into the derived
    ``deb-src`` entry (``Signed-By``, ``Trusted``, ``Check-Valid-Until``, …; binary-only
    options such as ``Architectures`` are dropped); ``origin``: the file it was read from.
    """

    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    origin: str


def parse_one_line_sources(text: str, origin: str = "sources.list") -> list[AptEntry]:
    """``deb`` entries of a one-line ``sources.list`` file (sources.list(5)).

    ``deb [opt=value …] URI SUITE [COMPONENT …]``; comments (``#``) and ``deb-src`` lines
    are skipped; options are mapped to deb822 names (:data:`_ONE_LINE_OPTIONS`), unknown
    ones title-cased, binary-only ones (``arch``, ``lang``, ``target`` and their
    ``+=``/``-=`` forms) dropped. Malformed lines are skipped with a warning, as apt would
    refuse them.
    """
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\S+)\s*(?:\[([^\]]*)\])?\s*(.*)$", line)
        if not m or m.group(1) != "deb":
            continue
        opts = []
        for opt in (m.group(2) or "").split():
            key, sep, value = opt.partition("=")
            key = key.rstrip("+-").lower()
            if not sep or key in _BINARY_ONLY_OPTIONS:
                continue
            opts.append((_ONE_LINE_OPTIONS.get(key, "-".join(w.capitalize() for w in key.split("-"))), value))
        rest = m.group(3).split()
        if len(rest) < 2:
            log.warning("%s:%d: malformed deb line skipped", origin, n)
            continue
        out.append(AptEntry((rest[0],), (rest[1],), tuple(rest[2:]), tuple(opts), origin))
    return out


def parse_deb822_sources(text: str, origin: str = "x.sources") -> list[AptEntry]:
    """``deb`` entries of a deb822 ``.sources`` file (sources.list(5), "DEB822-STYLE FORMAT").

    A stanza counts when its ``Types`` include ``deb`` and ``Enabled`` is not ``no``;
    field names are case-insensitive; every field other than ``Types``, ``URIs``,
    ``Suites``, ``Components``, ``Enabled`` and the binary-only ones
    (``Architectures``, ``Languages``, ``Targets`` and their ``-Add``/``-Remove`` forms) is
    carried as an option, multi-line values (an inline ``Signed-By`` key) included.
    """
    from debian.deb822 import Deb822

    out = []
    for para in Deb822.iter_paragraphs(text.splitlines(True)):
        fields = {k.lower(): (k, v) for k, v in para.items()}
        types = fields.get("types", ("", ""))[1].split()
        if "deb" not in types or fields.get("enabled", ("", "yes"))[1].strip().lower() == "no":
            continue
        uris = tuple(fields.get("uris", ("", ""))[1].split())
        suites = tuple(fields.get("suites", ("", ""))[1].split())
        if not uris or not suites:
            log.warning("%s: deb stanza without URIs or Suites skipped", origin)
            continue
        opts = []
        for low, (key, value) in fields.items():
            base = re.sub(r"-(add|remove)$", "", low)
            if low in _ENTRY_FIELDS or base in _BINARY_ONLY_OPTIONS:
                continue
            opts.append((key, value))
        out.append(AptEntry(uris, suites, tuple(fields.get("components", ("", ""))[1].split()), tuple(opts), origin))
    return out


def _apt_config_paths() -> dict[str, str]:
    """The machine's apt file locations and sandbox user (``apt-config shell``), with apt's
    compiled-in defaults as fallback."""
    keys = {"sourcelist": "Dir::Etc::sourcelist/f", "sourceparts": "Dir::Etc::sourceparts/d",
            "trusted": "Dir::Etc::trusted/f", "trustedparts": "Dir::Etc::trustedparts/d",
            "netrc": "Dir::Etc::netrc/f", "netrcparts": "Dir::Etc::netrcparts/d", "sandbox": "APT::Sandbox::User"}
    defaults = {"sourcelist": "/etc/apt/sources.list", "sourceparts": "/etc/apt/sources.list.d/",
                "trusted": "/etc/apt/trusted.gpg", "trustedparts": "/etc/apt/trusted.gpg.d/",
                "netrc": "/etc/apt/auth.conf", "netrcparts": "/etc/apt/auth.conf.d/", "sandbox": "_apt"}
    exe = shutil.which("apt-config")
    if exe is None:
        return defaults
    args = [exe, "shell"]
    for var, key in keys.items():
        args += [var.upper(), key]
    r = subprocess.run(args, capture_output=True, text=True, env=_clean_env(), timeout=60)
    got = dict(defaults)
    for line in r.stdout.splitlines():
        var, _, value = line.partition("=")
        if var.lower() in got:
            got[var.lower()] = value.strip().strip("'")
    return got


def machine_deb_entries(sourcelist: Path | None = None, sourceparts: Path | None = None) -> list[AptEntry]:
    """Every enabled ``deb`` entry the machine's apt reads, in apt's order: the
    ``sources.list`` file, then ``sources.list.d/*.list`` and ``*.sources`` sorted by name
    (other file names — ``*.disabled``, ``*.save``, … — are ignored, as apt ignores them).

    ``sourcelist``/``sourceparts`` default to the machine's ``Dir::Etc::sourcelist`` and
    ``Dir::Etc::sourceparts``. Duplicate entries are kept once.
    """
    if sourcelist is None or sourceparts is None:
        conf = _apt_config_paths()
        sourcelist = Path(conf["sourcelist"]) if sourcelist is None else sourcelist
        sourceparts = Path(conf["sourceparts"]) if sourceparts is None else sourceparts
    entries: list[AptEntry] = []
    if Path(sourcelist).is_file():
        entries += parse_one_line_sources(Path(sourcelist).read_text(encoding="utf-8", errors="replace"), str(sourcelist))
    if Path(sourceparts).is_dir():
        for f in sorted(Path(sourceparts).iterdir()):
            if not f.is_file() or not re.fullmatch(r"[A-Za-z0-9_.-]+\.(list|sources)", f.name):
                continue
            text = f.read_text(encoding="utf-8", errors="replace")
            entries += parse_one_line_sources(text, str(f)) if f.suffix == ".list" else parse_deb822_sources(text, str(f))
    seen, out = set(), []
    for e in entries:
        key = (e.uris, e.suites, e.components, e.options)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _field(key: str, value: str) -> str:
    lines = value.strip("\n").split("\n")
    first = lines[0].strip()
    rest = ["." if not ln.strip() else ln.strip() for ln in lines[1:]]
    return "\n".join([f"{key}: {first}".rstrip()] + [f" {ln}" for ln in rest])


def render_deb_src(entries: Iterable[AptEntry]) -> str:
    """The derived ``deb-src`` entries as one deb822 ``.sources`` text (deterministic)."""
    stanzas = []
    for e in entries:
        lines = [f"# from {e.origin}", "Types: deb-src", f"URIs: {' '.join(e.uris)}", f"Suites: {' '.join(e.suites)}"]
        if e.components:
            lines.append(f"Components: {' '.join(e.components)}")
        lines += [_field(k, v) for k, v in e.options]
        stanzas.append("\n".join(lines) + "\n")
    return "\n".join(stanzas)


def _machine_acquire_settings() -> list[str]:
    """The machine's ``Acquire::`` settings (``apt-config dump``) as apt.conf lines, minus
    :data:`_NOT_CARRIED`; values holding a quote or newline are skipped."""
    exe = shutil.which("apt-config")
    if exe is None:
        return []
    r = subprocess.run([exe, "dump"], capture_output=True, text=True, env=_clean_env(), timeout=60)
    out = []
    for line in r.stdout.splitlines():
        m = re.fullmatch(r'(Acquire::\S*) "(.*)";', line)
        if not m or m.group(1).startswith(_NOT_CARRIED) or '"' in m.group(2):
            continue
        out.append(line)
    return out


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "APT_CONFIG"}
    env["LC_ALL"] = "C"
    return env


@dataclass(frozen=True)
class AptConfig:
    """The project's private apt configuration under ``root`` (``CACHE/debian/apt/KEY``).

    ``key``: 16 hex digits of sha256 over the derived sources and the private ``apt.conf``
    (a change in the machine's entries gives a new directory, hence a fresh
    ``apt-get update``); ``entries``: the machine ``deb`` entries it was derived from.
    """

    root: Path
    key: str
    entries: tuple[AptEntry, ...]

    @property
    def stamp(self) -> Path:
        """File written after a successful ``apt-get update`` of this configuration."""
        return self.root / "update.ok"

    def options(self) -> list[str]:
        """``-o`` options that point every apt state, cache, log and source location here."""
        r = self.root
        opts = {
            "Dir::State": r / "state", "Dir::State::status": r / "state" / "status",
            "Dir::Cache": r / "cache", "Dir::Log": r / "log",
            "Dir::Etc::sourcelist": r / "sources.list", "Dir::Etc::sourceparts": r / "sources.list.d",
            "Dir::Etc::preferences": r / "preferences", "Dir::Etc::preferencesparts": r / "preferences.d",
        }
        out = []
        for k, v in opts.items():
            out += ["-o", f"{k}={v}"]
        return out

    def env(self) -> dict[str, str]:
        """Environment for apt: ``APT_CONFIG`` = the private ``apt.conf``, ``LC_ALL=C``."""
        env = _clean_env()
        env["APT_CONFIG"] = str(self.root / "apt.conf")
        return env


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + f".{os.getpid()}.part")
    tmp.write_text(text)
    os.replace(tmp, path)


def private_apt_config(cache_root: Path, sourcelist: Path | None = None, sourceparts: Path | None = None) -> AptConfig:
    """Write (idempotently) and return the private apt configuration under ``cache_root``.

    Layout of ``cache_root/debian/apt/KEY/``: ``sources.list`` (empty),
    ``sources.list.d/derived.sources`` (:func:`render_deb_src`), ``apt.conf`` (read through
    ``APT_CONFIG``: ``Dir::Etc::parts`` → the empty ``apt.conf.d/`` here so no machine hook
    runs, the machine's keyring and credential locations, its sandbox user and its
    ``Acquire::`` settings),
    ``preferences.d/``, ``state/`` (``lists/``, an empty dpkg ``status``), ``cache/``,
    ``log/``. Raises :class:`AptConfigError` when the machine has no ``deb`` entry.
    """
    entries = machine_deb_entries(sourcelist, sourceparts)
    if not entries:
        raise AptConfigError("the machine's apt configuration has no deb entry to derive deb-src entries from "
                             f"(read {sourcelist or 'Dir::Etc::sourcelist'} and {sourceparts or 'Dir::Etc::sourceparts'})")
    sources = render_deb_src(entries)
    paths = _apt_config_paths()
    conf_lines = ["// Private apt configuration of the debian source kind (megacpp_core.acquire_debian).",
                  "// Derived from the machine's apt configuration; never edit by hand."]
    for key in ("trusted", "trustedparts", "netrc", "netrcparts"):
        conf_lines.append(f'Dir::Etc::{key} "{paths[key]}";')
    conf_lines.append(f'APT::Sandbox::User "{paths["sandbox"]}";')
    conf_lines += _machine_acquire_settings()
    key = hashlib.sha256((sources + "\0" + "\n".join(conf_lines)).encode()).hexdigest()[:16]
    root = Path(cache_root).resolve() / "debian" / "apt" / key
    conf_lines[2:2] = [f'Dir::Etc::parts "{root / "apt.conf.d"}";', 'Dir::Etc::main "/dev/null";']
    for d in ("apt.conf.d", "preferences.d", "sources.list.d", "state/lists/partial", "cache/archives/partial", "log"):
        (root / d).mkdir(parents=True, exist_ok=True)
    _write(root / "sources.list.d" / "derived.sources", sources)
    _write(root / "sources.list", "")
    _write(root / "state" / "status", "")
    _write(root / "apt.conf", "\n".join(conf_lines) + "\n")
    return AptConfig(root, key, tuple(entries))


# --------------------------------------------------------------------------- apt calls


def _require_apt(source: Source) -> tuple[str, str]:
    get, cache = shutil.which("apt-get"), shutil.which("apt-cache")
    if get is None or cache is None:
        raise AptMissingError(f"source {source.name}: the {'apt-get' if get is None else 'apt-cache'} command is not "
                              "installed; the debian kind fetches with apt-get source (SPEC §3)")
    return get, cache


@contextlib.contextmanager
def _locked(config: AptConfig) -> Iterator[None]:
    """An exclusive lock on the configuration (apt's own locks would fail, not wait)."""
    with open(config.root / "megacpp.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(args: list[str], config: AptConfig, source: Source, cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, cwd=cwd, capture_output=True, env=config.env(), timeout=APT_TIMEOUT_S)
    except FileNotFoundError:
        raise AptMissingError(f"source {source.name}: {args[0]} is not installed") from None


def _stderr(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.decode("utf-8", "replace").splitlines() if ln.startswith(("E:", "Err:"))]
    return " / ".join(lines[-5:]) or r.stderr.decode("utf-8", "replace").strip()[-500:]


def apt_update(config: AptConfig, source: Source) -> None:
    """``apt-get update`` of the private configuration (only ``Sources`` indexes: every
    entry is ``deb-src``); writes the stamp. Raises :class:`AptError` on failure."""
    get, _ = _require_apt(source)
    r = _run([get, "-q", *config.options(), "update"], config, source)
    if r.returncode != 0:
        raise AptError(f"source {source.name}: apt-get update of the derived deb-src entries failed: {_stderr(r)}")
    _write(config.stamp, json.dumps({"updated_at": int(time.time())}))
    log.info("%s: apt-get update of %s done", source.name, config.root)


def source_versions(config: AptConfig, source: Source) -> dict[str, Dsc]:
    """Every version of ``source.package`` in the configured suites (``apt-cache showsrc
    --only-source``), as ``{version: Dsc built from the index entry}``; ``{}`` when the
    package is unknown. Entries whose file list cannot be classified are left out.
    Raises :class:`AptError` when apt-cache itself fails (e.g. unreadable indexes)."""
    from debian.deb822 import Sources

    _, cache = _require_apt(source)
    r = _run([cache, *config.options(), "showsrc", "--only-source", source.package], config, source)
    out: dict[str, Dsc] = {}
    if r.returncode != 0:  # an unknown package is only a warning ("W: Unable to locate package")
        raise AptError(f"source {source.name}: apt-cache showsrc {source.package} failed: {_stderr(r)}")
    for para in Sources.iter_paragraphs(io.StringIO(r.stdout.decode("utf-8", "replace")), use_apt_pkg=False):
        if para.get("Package") != source.package:
            continue
        try:
            pkg, ver, fmt, files = _files_from_paragraph(para, f"index entry {source.package}", index=True)
        except DscFormatError as e:
            log.warning("%s: %s", source.name, e)
            continue
        out.setdefault(ver, Dsc(pkg, ver, fmt, files))
    return out


def _index_age(config: AptConfig) -> float | None:
    if not config.stamp.exists():
        return None
    try:
        return time.time() - json.loads(config.stamp.read_text())["updated_at"]
    except (ValueError, KeyError):
        return None


def locate_version(config: AptConfig, source: Source) -> Dsc:
    """The index entry of the pinned version; runs ``apt-get update`` first when this
    configuration never was, and again when the version is missing from indexes older
    than :data:`REFRESH_AFTER_S`. Raises :class:`DebianVersionNotFoundError` naming the
    versions the suites do carry."""
    with _locked(config):
        age = _index_age(config)
        if age is None:
            apt_update(config, source)
            age = 0.0
        versions = source_versions(config, source)
        if source.version not in versions and age > REFRESH_AFTER_S:
            apt_update(config, source)
            versions = source_versions(config, source)
    if source.version not in versions:
        suites = sorted({s for e in config.entries for s in e.suites})
        if not versions:
            raise DebianVersionNotFoundError(
                f"source {source.name}: source package {source.package!r} is not in the configured suites "
                f"({', '.join(suites)}) — the deb-src entries are derived from the machine's deb entries")
        raise DebianVersionNotFoundError(
            f"source {source.name}: version {source.version} of source package {source.package!r} is not in the "
            f"configured suites ({', '.join(suites)}); available: {', '.join(sorted(versions))}")
    return versions[source.version]
