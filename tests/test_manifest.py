"""Manifest loading: shipped manifests pin what the issue lists; bad manifests fail clearly."""

from __future__ import annotations

import pytest

from megacpp_core.manifest import ManifestError, load_manifest


def test_shipped_manifests():
    d = load_manifest("default")
    assert len(d.sources) == 16 and d.settings.vocab_size == 131072 and d.settings.row_length == 8192
    assert d.source("zstandard-0.25.0").sha256 == "7713e1179d162cf5c7906da876ec2ccb9c3a9dcbdffef0cc7f70c3667a205f0b"
    t = load_manifest("tiny")
    assert [s.name for s in t.sources] == ["pybind11-3.1.0", "lz4-4.4.5", "xxhash-4.1.0"]
    assert t.partition_key(t.sources[1]) == "tiny/lz4-4.4.5"


@pytest.mark.parametrize("body,needle", [
    ("name: x\nsources:\n  - {name: a, kind: svn, package: a, version: '1', sha256: '%s'}\n" % ("0" * 64), "field 'kind'"),
    ("name: x\nsources:\n  - {name: a, kind: pypi, package: a, version: '1'}\n", "field 'sha256'"),
    ("name: x\nsources:\n  - {name: a, kind: pypi, package: a, version: '1', sha256: '%s'}\n  - {name: a, kind: pypi, package: b, version: '1', sha256: '%s'}\n" % ("0" * 64, "1" * 64), "duplicates"),
    ("name: x\nsettings: {row_lenght: 5}\nsources:\n  - {name: a, kind: pypi, package: a, version: '1', sha256: '%s'}\n" % ("0" * 64), "row_lenght"),
])
def test_bad_manifest_names_manifest_source_field(tmp_path, body, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(ManifestError) as e:
        load_manifest(p)
    assert "bad.yaml" in str(e.value) and needle in str(e.value)


Z = "0" * 64


@pytest.mark.parametrize("src,field", [
    ("{name: a, kind: svn, url: x}", "kind"),
    ("{name: a, kind: archive, path: a.tar.gz}", "sha256"),
    ("{name: a, kind: archive, path: a.tar.gz, url: 'file:///a.tar.gz', sha256: '%s'}" % Z, "url' or 'path"),
    ("{name: a, kind: archive, path: a.rar, sha256: '%s'}" % Z, "path"),
    ("{name: a, kind: archive, path: a.tar.gz, sha256: 'abc'}", "sha256"),
    ("{name: a, kind: git, url: 'file:///r'}", "tag"),
    ("{name: a, kind: git, url: 'file:///r', tag: v1, branch: main}", "branch"),
    ("{name: a, kind: git, url: 'file:///r', tag: v1, commit: deadbeef}", "commit"),
    ("{name: a, kind: git, url: 'file:///r', tag: 1.0}", "tag"),
    ("{name: a, kind: local, path: /srv/x}", "label"),
    ("{name: a, kind: local, path: /srv/x, label: l, python_package: torch}", "path' or 'python_package"),
    ("{name: a, kind: local, python_package: no-such-package-here}", "python_package"),
    ("{name: a, kind: local, python_package: torch, subdir: ../../etc}", "subdir"),
    ("{name: a, kind: pypi, package: a, version: '1', sha256: '%s', url: x}" % Z, "url"),
    ("{name: a, kind: pypi, package: a, sha256: '%s'}" % Z, "version"),
])
def test_bad_source_fields_name_manifest_source_field(tmp_path, src, field):
    p = tmp_path / "bad.yaml"
    p.write_text(f"name: x\nsources:\n  - {src}\n")
    with pytest.raises(ManifestError) as e:
        load_manifest(p)
    msg = str(e.value)
    assert str(p) in msg and "source 'a'" in msg and f"field '{field}" in msg, msg


def test_every_kind_loads(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("name: k\nschedule: '0 5 * * *'\ntokenizer: {path: t.json, sha256: '%s'}\nsources:\n"
                 "  - {name: p, kind: pypi, package: lz4, version: '4.4.5', sha256: '%s'}\n"
                 "  - {name: g, kind: git, url: 'file:///r.git', tag: v1.0}\n"
                 "  - {name: a, kind: archive, path: sub/a-1.tar.xz, sha256: '%s'}\n"
                 "  - {name: l, kind: local, path: src, label: snap-1}\n" % (Z, Z, Z))
    m = load_manifest(p)
    assert [s.kind for s in m.sources] == ["pypi", "git", "archive", "local"] and m.schedule == "0 5 * * *"
    assert m.source("g").version == "v1.0" and m.source("a").path == str(tmp_path / "sub" / "a-1.tar.xz")
    assert m.source("a").version == "a-1.tar.xz" and m.source("l").version == "snap-1"
    assert m.revision_pin(m.source("g")) != m.revision_pin(m.source("a"))


def test_version_missing_on_index_fails_before_the_run(tmp_path, monkeypatch):
    """A pinned version the index does not have fails when the run starts, naming the manifest,
    the source and the field; an already cached pin is not looked up."""
    from megacpp_core import acquire

    page = tmp_path / "simple" / "lz4"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text('<a href="../../f/lz4-4.4.5.tar.gz#sha256=%s">lz4-4.4.5.tar.gz</a>' % Z)
    monkeypatch.setenv("MEGACPP_INDEX_URL", (tmp_path / "simple").as_uri())
    p = tmp_path / "v.yaml"
    p.write_text("name: v\nsources:\n  - {name: lz4-9, kind: pypi, package: lz4, version: '9.9.9', sha256: '%s'}\n" % ("1" * 64))
    m = load_manifest(p)
    with pytest.raises(ManifestError) as e:
        acquire.check_pins(m, tmp_path / "cache")
    assert "v.yaml" in str(e.value) and "'lz4-9'" in str(e.value) and "field 'version'" in str(e.value) and "9.9.9" in str(e.value)
    cached = acquire.cache_path(tmp_path / "cache", "1" * 64, "lz4-9.9.9.tar.gz")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    acquire.check_pins(m, tmp_path / "cache")


def test_megacpp_run_refuses_bad_manifest_with_exit_2(tmp_path, capsys, monkeypatch):
    from megacpp_assets.cli import run_snapshot

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))  # restored after the test
    monkeypatch.setenv("MEGACPP_DATA_ROOT", str(tmp_path / "root"))

    p = tmp_path / "dup.yaml"
    p.write_text("name: d\nsources:\n  - {name: a, kind: local, path: ., label: x}\n  - {name: a, kind: local, path: ., label: y}\n")
    assert run_snapshot(str(p), str(tmp_path / "root")) == 2
    err = capsys.readouterr().err
    assert "dup.yaml" in err and "'a'" in err and "field 'name'" in err


def test_unknown_keys_are_errors_with_the_nearest_known_key(tmp_path):
    from megacpp_core.manifest import ManifestError, load_manifest

    src = "sources:\n  - {name: a, kind: local, path: /tmp, label: v1}\n"
    cases = {"name: s\nsetings: {row_length: 4096}\n" + src: "field 'setings' is not a known top-level key; did you mean 'settings'?",
             "name: s\nsource: []\n" + src: "did you mean 'sources'?",
             "name: s\nowner: me\n" + src: "(known: name, schedule, settings, sources, tokenizer)",
             "name: s\nsettings: {row_lenght: 4096}\n" + src: "settings.row_lenght is not a known setting; did you mean 'row_length'?"}
    for i, (body, msg) in enumerate(cases.items()):
        p = tmp_path / f"m{i}.yaml"
        p.write_text(body)
        with pytest.raises(ManifestError) as e:
            load_manifest(p)
        assert msg in str(e.value) and str(p) in str(e.value)


def test_a_parsed_document_is_reused_but_never_shared(tmp_path):
    """The YAML of a manifest text is parsed once per process (every step parses its
    snapshot's manifest); each call validates its own copy, which leaves the cached
    document as parsed, and a bad text raises every time."""
    import yaml

    from megacpp_core import manifest as mf

    path = tmp_path / "m.yaml"
    text = ("name: snap\nsettings: {row_length: 4096}\n"
            "sources:\n  - {name: a, kind: local, path: src, label: a-1}\n")
    first, second = mf.parse_manifest(text, path), mf.parse_manifest(text, path)
    assert first == second and first.settings.row_length == 4096
    assert mf._load_yaml(text) == yaml.safe_load(text)  # untouched by the two validations
    assert mf._load_yaml(text) is mf._load_yaml(text)
    for _ in range(2):
        with pytest.raises(mf.ManifestError, match="not valid YAML"):
            mf.parse_manifest("name: [unclosed\n", path)
    for deep in ("[" * 2000 + "]" * 2000, "name: x\nsettings: {row_length: " + "[" * 2000 + "]" * 2000 + "}\n"):
        with pytest.raises(mf.ManifestError):
            mf.parse_manifest(deep, path)
