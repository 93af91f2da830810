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
