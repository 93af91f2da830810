"""Per-document platform labels (megacpp_core.platforms, SPEC §4): the versioned vocabulary
and its validation, the multi-literal scanner with identifier boundaries and prefixes, the
numeric standard tests, the 20-label cap, and the labels of real corpus files (llama.cpp's
CUDA, Metal and CPU backends in llama-cpp-python, xxhash)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from megacpp_core import acquire
from megacpp_core import platforms as P
from megacpp_core.manifest import load_manifest
from megacpp_core.pack import PLATFORM_TYPE

from .conftest import SHARED_CACHE

V = P.load_vocabulary()
PACKAGED = Path(P.__file__).parent / "data" / "platforms" / "v1.json"
CATEGORIES = {"os", "rtos", "gpu", "arch", "compiler", "std"}
#: The first 113 labels of v1 as ``id:name:category`` lines. Ids are append-only: new labels
#: may follow, but these may never change.
V1_COUNT = 113
V1_PREFIX_SHA256 = "3fced63514dc3d6bb69fab9f05e773c2afda035ae32a408639b0ca3099e41f3d"


def names(text, **kw) -> list[str]:
    return P.label_names(P.scan_platforms(text, **kw))


# --------------------------------------------------------------------------------------------
# the vocabulary


def test_vocabulary_shape_and_append_only_ids():
    assert P.VOCAB_VERSION == V.version == "v1" and P.MAX_LABELS_PER_DOCUMENT == 20
    assert 100 <= V.size <= 130
    assert [i for i, _, _ in V.labels] == list(range(1, V.size + 1))
    assert P.NONE_ID == 0 and V.name_of(0) == "none" and "none" not in {n for _, n, _ in V.labels}
    assert V.size <= P.MAX_LABEL_ID
    assert {c for _, _, c in V.labels} == CATEGORIES == set(V.categories)
    assert all(n.startswith(c + ".") for _, n, c in V.labels)
    assert len({n for _, n, _ in V.labels}) == V.size
    counts = Counter(c for _, _, c in V.labels)
    assert counts == {"os": 20, "rtos": 14, "gpu": 15, "arch": 40, "compiler": 13, "std": 11}
    prefix = "\n".join(f"{i}:{n}:{c}" for i, n, c in V.labels[:V1_COUNT])
    assert hashlib.sha256(prefix.encode()).hexdigest() == V1_PREFIX_SHA256, "v1 ids were renumbered or renamed"
    assert V.sha256 == hashlib.sha256(PACKAGED.read_bytes()).hexdigest()
    assert P.load_vocabulary() is V  # cached per process
    for name in ("os.windows", "os.linux", "os.apple", "gpu.cuda", "gpu.hip", "gpu.metal", "arch.avx2", "arch.neon",
                 "arch.aarch64", "arch.riscv", "compiler.gcc", "compiler.clang", "compiler.msvc", "rtos.freertos",
                 "rtos.zephyr", "rtos.threadx", "std.cxx98", "std.cxx17", "std.cxx26", "std.c11"):
        assert V.name_of(V.id_of(name)) == name
    raw = json.loads(PACKAGED.read_text())
    assert all(lab["indicators"] or lab["prefixes"] for lab in raw["labels"])
    assert any("append-only" in n for n in raw["notes"])
    again = P.load_vocabulary(path=PACKAGED)  # an explicit path is read again, not cached
    assert again is not V and (again.labels, again.indicators, again.sha256) == (V.labels, V.indicators, V.sha256)


def test_every_label_is_reachable_by_an_indicator_of_its_own():
    """Each label has an indicator that, alone in a text, yields exactly that label."""
    raw = json.loads(PACKAGED.read_text())
    for lab in raw["labels"]:
        hits = [s for s in lab["indicators"] + lab["prefixes"] if P.scan_platforms(f" {s} ") == [lab["id"]]]
        assert hits, lab["name"]


def _corrupt(tmp_path, mutate) -> Path:
    data = json.loads(PACKAGED.read_text())
    mutate(data)
    p = tmp_path / "v1.json"
    p.write_text(json.dumps(data, indent=1))
    return p


def _label(data, name):
    return next(lab for lab in data["labels"] if lab["name"] == name)


CORRUPTIONS = {
    "duplicate id": (lambda d: d["labels"][5].update(id=d["labels"][4]["id"]), "duplicate id 5"),
    "gap": (lambda d: d["labels"].pop(10), r"id 12 where 11 is expected .* 1\.\.N"),
    "reordered": (lambda d: d["labels"].insert(0, d["labels"].pop(2)), "id 3 where 1 is expected"),
    "id 0": (lambda d: d["labels"][0].update(id=0), "id 0 is reserved"),
    "id not int": (lambda d: d["labels"][0].update(id="1"), "is not an integer"),
    "empty indicators": (lambda d: d["labels"][3].update(indicators=[], prefixes=[]), r"os\.ios.*has no indicator"),
    "empty string": (lambda d: d["labels"][3]["indicators"].append(""), "non-empty strings"),
    "listed twice": (lambda d: d["labels"][1]["indicators"].append("__linux__"), "'__linux__' is listed twice"),
    "duplicate name": (lambda d: d["labels"][7].update(name=d["labels"][6]["name"]), "duplicate name 'os.netbsd'"),
    "name vs category": (lambda d: d["labels"][0].update(category="gpu"), "does not start with its category"),
    "unknown category": (lambda d: d["labels"][0].update(category="kernel", name="kernel.windows"), "not declared"),
    "shared, undeclared": (lambda d: _label(d, "os.linux")["indicators"].append("_WIN32"),
                           r"'_WIN32' is claimed by os\.windows, os\.linux but not declared"),
    "shared, declaration removed": (lambda d: d["shared_indicators"].pop("__MINGW32__"), "'__MINGW32__' is claimed"),
    "shared, wrong labels": (lambda d: d["shared_indicators"].update({"__MINGW32__": ["os.windows", "os.cygwin"]}),
                             "'shared_indicators' lists"),
    "shared, stale": (lambda d: d["shared_indicators"].update({"__nothing__": ["os.linux", "os.apple"]}),
                      "declares '__nothing__'"),
    "reserved": (lambda d: d.update(reserved={"0": "other"}), "id 0 is reserved"),
    "version": (lambda d: d.update(version="v2"), "file says version 'v2', expected 'v1'"),
    "unknown key": (lambda d: d["labels"][0].update(indicator=["x"]), "unknown keys"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupted_copies_are_refused_with_a_clear_message(tmp_path, case):
    mutate, message = CORRUPTIONS[case]
    path = _corrupt(tmp_path, mutate)
    with pytest.raises(ValueError, match=message) as e:
        P.load_vocabulary(path=path)
    assert str(path) in str(e.value)


def test_unreadable_or_malformed_files_are_refused(tmp_path):
    p = tmp_path / "v1.json"
    p.write_bytes(b"{not json")
    with pytest.raises(ValueError, match="not valid UTF-8 JSON"):
        P.load_vocabulary(path=p)
    with pytest.raises(ValueError, match="not readable"):
        P.load_vocabulary(path=tmp_path / "missing.json")
    with pytest.raises(ValueError, match="not of the form v<N>"):
        P.load_vocabulary("latest")
    ok = _corrupt(tmp_path, lambda d: None)  # re-serialized: other bytes, same labels
    again = P.load_vocabulary(path=ok)
    assert again.labels == V.labels and again.sha256 != V.sha256
    assert P.scan_platforms("#ifdef __linux__", vocab=again) == P.scan_platforms("#ifdef __linux__")


# --------------------------------------------------------------------------------------------
# the scanner


@pytest.mark.parametrize("text, expected", [
    ("#ifdef _WIN32\n#include <windows.h>\n#endif", ["os.windows"]),
    ("#if _WIN32_WINNT >= 0x0600", ["os.windows"]),
    ("#if defined(__linux__)\n", ["os.linux"]),
    ("#if defined(__APPLE__) && defined(__MACH__)", ["os.apple"]),
    ("#ifdef __ANDROID__", ["os.android"]),
    ("#ifdef __CUDACC__\n#define HD __host__ __device__\n#endif", ["gpu.cuda"]),
    ("__global__ void k(float *x) { x[threadIdx.x] = 0; }", ["gpu.cuda"]),
    ("cudaMalloc(&p, n); cudaMemcpyAsync(p, q, n, cudaMemcpyHostToDevice, s);", ["gpu.cuda"]),
    ('#include "common.cuh"', ["gpu.cuda"]),
    ("#if defined(__HIP_PLATFORM_AMD__)\nhipMalloc(&p, n);", ["gpu.hip"]),
    ("__kernel void add(__global float *a) {}", ["gpu.opencl"]),
    ("#include <metal_stdlib>\nusing namespace metal;", ["gpu.metal"]),
    ("#ifdef __AVX2__\n#include <immintrin.h>\n#endif", ["arch.x86", "arch.avx2"]),
    ("__m256i s = _mm256_add_epi32(a, b);", ["arch.avx", "arch.avx2"]),
    ("#if defined(__ARM_NEON)\nfloat32x4_t v = vld1q_f32(p);", ["arch.neon"]),
    ("#if defined(__aarch64__) || defined(_M_ARM64)", ["arch.aarch64"]),
    ("#if defined(__riscv)", ["arch.riscv"]),
    ("#if defined(__GNUC__) && !defined(__clang__)", ["compiler.gcc", "compiler.clang"]),
    ("#if _MSC_VER >= 1900", ["compiler.msvc"]),
    ("#ifdef __INTEL_COMPILER", ["compiler.intel"]),
    ("#ifdef __MINGW32__", ["os.windows", "compiler.mingw"]),  # a declared shared indicator
    ("xTaskCreate(task, \"t\", 128, NULL, 1, NULL);\nvTaskDelay(pdMS_TO_TICKS(10));", ["rtos.freertos"]),
    ("#define configUSE_PREEMPTION 1", ["rtos.freertos"]),
    ("k_thread_create(&t, stack, K_THREAD_STACK_SIZEOF(stack), f, 0, 0, 0, 5, 0, K_NO_WAIT);", ["rtos.zephyr"]),
    ("tx_thread_create(&t, \"t\", entry, 0, stack, 1024, 1, 1, TX_NO_TIME_SLICE, TX_AUTO_START);", ["rtos.threadx"]),
    ("auto p = std::make_unique<int>(1);", ["std.cxx14"]),
    ("if constexpr (N > 0) { std::optional<int> o; }", ["std.cxx11", "std.cxx17"]),  # constexpr: C++11
    ("co_await s; std::span<int> v;", ["std.cxx20"]),
])
def test_known_indicators(text, expected):
    got = names(text)
    assert sorted(got) == sorted(expected)
    assert got == sorted(got, key=V.id_of)  # ids come back sorted


def test_mm256_add_ps_is_avx_and_avx2_needs_integer_or_macro_evidence():
    # VADDPS ymm is an AVX instruction; AVX2 is the 256-bit integer set and the __AVX2__ macro.
    assert names("_mm256_add_ps(a, b)") == ["arch.avx"]
    assert names("#if defined(__AVX2__)\n__m256 s = _mm256_add_ps(a, b);\n#endif") == ["arch.avx", "arch.avx2"]
    assert names("_mm256_fmadd_ps(a, b, c)") == ["arch.avx", "arch.fma"]


@pytest.mark.parametrize("text", [
    "my__linux__x", "int x__linux__;", "__linux__2", "x_WIN32", "_WIN32x", "MY_MSC_VER", "_MSC_VERSION",
    "x__CUDACC__", "my__global__", "xxTaskCreate(t)", "not_pthread_create()", "x_mm256_add_ps", "myvld1q_f32",
    "__AVX2__x", "__AVX2", "AVX2", "linux", "windows", "cuda", "BSD license", "neon lights", "the metal box",
    "std::optional_like", "mycub::DeviceReduce", "__cplusplus_x >= 201703", "MY__cplusplus >= 201703",
    "__cplusplus >= 2017030", "version 201703", "mbed_ctx->conf",
])
def test_identifier_boundaries_and_plain_words(text):
    assert P.scan_platforms(text) == [], P.explain(text)


def test_longer_identifiers_match_their_own_indicator_only():
    assert P.explain("#if __GNUC_MINOR__ > 3") == {"compiler.gcc": ["__GNUC_MINOR__"]}
    assert P.explain("__global__ void f();") == {"gpu.cuda": ["__global__"]}
    assert P.explain("__global float *p;") == {"gpu.opencl": ["__global"]}
    assert P.explain("#ifdef __ARM_NEON__") == {"arch.neon": ["__ARM_NEON__"]}
    assert P.explain("vld1q_f32(p)") == {"arch.neon": ["vld1q_"]}  # a prefix runs on into the identifier
    assert P.explain("_mm256_add_epi32(a, b)") == {"arch.avx": ["_mm256_"], "arch.avx2": ["_mm256_add_epi"]}


@pytest.mark.parametrize("text, expected", [
    ("#if __cplusplus >= 201703L", ["std.cxx17"]),
    ("#if __cplusplus >= 201703", ["std.cxx17"]),  # no suffix: only the regex sees it
    ("#if (__cplusplus) >= 201703UL", ["std.cxx17"]),
    ("#if __cplusplus > 201402L", ["std.cxx14", "std.cxx17"]),  # the literal names C++14, '>' means C++17
    ("#if __cplusplus > 201402", ["std.cxx17"]),
    ("#if __cplusplus == 202002L", ["std.cxx20"]),
    ("#if __cplusplus >= 201406L", ["std.cxx17"]),  # a C++1z draft value
    ("#if 201103 <= __cplusplus", ["std.cxx11"]),  # value first
    ("#if 201103 < __cplusplus", ["std.cxx14"]),
    ("#if __cplusplus < 201103", ["std.cxx11"]),
    ("#if __cplusplus >= 199711", ["std.cxx98"]),
    ("#if __cplusplus > 202302", ["std.cxx26"]),
    ("#if __cplusplus >= 202400", ["std.cxx26"]),
    ("#if defined(_MSVC_LANG) && _MSVC_LANG >= 201703", ["compiler.msvc", "std.cxx17"]),
    ("#if __STDC_VERSION__ >= 201112", ["std.c11"]),
    ("#if __STDC_VERSION__ >= 199901L", ["std.c99"]),
    ("#if __STDC_VERSION__ > 201710", ["std.c23"]),
    ("#if __STDC_VERSION__ >= 199409L", []),  # C95: no label
    ("#if __STDC_VERSION__ > 202311", []),  # after C23: no label in v1
    ("#if defined(__cplusplus)", []),
])
def test_numeric_standard_tests(text, expected):
    assert sorted(names(text)) == sorted(expected), P.explain(text)


def test_standard_for_test_rule():
    assert P.standard_for_test("__cplusplus", ">=", 201703) == "std.cxx17"
    assert P.standard_for_test("__cplusplus", ">", 201703) == "std.cxx20"
    assert P.standard_for_test("_MSVC_LANG", "==", 201402) == "std.cxx14"
    assert P.standard_for_test("__cplusplus", "<=", 100000) == "std.cxx98"
    assert P.standard_for_test("__STDC_VERSION__", ">=", 201710) == "std.c17"
    assert P.standard_for_test("__STDC_VERSION__", "<", 199409) is None
    with pytest.raises(ValueError):
        P.standard_for_test("__GNUC__", ">=", 201703)
    with pytest.raises(ValueError):
        P.standard_for_test("__cplusplus", "=>", 201703)


def test_empty_binary_and_hostile_text():
    assert P.scan_platforms("") == [] and P.scan_platforms(" \n\t") == [] and P.scan_platforms(b"") == []
    hostile = "\x00\x00#ifdef __linux__\x00\udcff\ud800 é日本😀 __APPLE__\x00" + "\ufffd" * 100
    assert names(hostile) == ["os.linux", "os.apple"]
    assert names(b"\xff\xfe\x00#ifdef _WIN32\x00\x80") == ["os.windows"]  # bytes: UTF-8 + surrogateescape
    assert P.scan_platforms("\udcff" * 10_000) == []
    assert P.scan_platforms("_" * 10_000 + "__linux__") == []  # glued to a long identifier
    # blanks after a version macro: the regex is written without nested quantifiers over
    # blanks (linear); the result is asserted here, never a wall-clock time
    assert P.scan_platforms("#if __cplusplus" + " " * 100_000 + ">=" + " " * 100_000 + "x") == []
    with pytest.raises(TypeError):
        P.scan_platforms(123)
    with pytest.raises(ValueError):
        P.scan_platforms("__linux__", max_labels=-1)
    assert P.scan_platforms("__linux__", max_labels=0) == []


def _solo_indicators() -> dict[int, str]:
    """For every label, one of its indicators that alone yields exactly that label."""
    raw = json.loads(PACKAGED.read_text())
    out = {}
    for lab in raw["labels"]:
        for s in lab["indicators"] + lab["prefixes"]:
            if P.scan_platforms(f" {s} ") == [lab["id"]]:
                out[lab["id"]] = s
                break
    return out


def test_cap_keeps_exactly_twenty_by_the_documented_rank():
    solo = _solo_indicators()
    ids = sorted(solo)[:40]
    # each of 40 labels once, in id order; then labels 31..36 twice more at the end
    text = "\n".join(f"#if X {solo[i]}" for i in ids) + "\n" + "\n".join(f"{solo[i]} {solo[i]}" for i in ids[30:36])
    assert sorted(P.evidence(text)) == ids
    got = P.scan_platforms(text)
    # the six with 3 matches win, then the earliest 14 of the rest (ties on count broken by offset)
    assert got == sorted(ids[30:36] + ids[:14])
    assert len(got) == P.MAX_LABELS_PER_DOCUMENT
    assert all(P.scan_platforms(text) == got for _ in range(3))
    assert P.scan_platforms(text, max_labels=5) == sorted(ids[30:35])
    assert P.scan_platforms(text, max_labels=100) == ids
    ev = P.evidence(text)
    first = sum(len(f"#if X {solo[i]}") + 1 for i in ids[:30]) + len("#if X ")
    assert P.rank(ev)[:6] == ids[30:36] and ev[ids[30]] == (3, first)


def test_determinism_batches_and_uint16_column():
    texts = ["#ifdef _WIN32\n__m256 x;", "", "__global__ void f(); #if __cplusplus >= 201703L", "\udcff"] * 3
    once = P.scan_many(texts)
    assert once == P.scan_many(texts) == [P.scan_platforms(t) for t in texts]
    assert once[0] == once[4] and once[1] == []
    col = pa.array(once, type=PLATFORM_TYPE)
    assert col.to_pylist() == once and col.type.value_type == pa.uint16()


def test_label_names_and_figures():
    w, lx, cu = V.id_of("os.windows"), V.id_of("os.linux"), V.id_of("gpu.cuda")
    assert P.label_names([0, w, lx]) == ["none", "os.windows", "os.linux"]
    for bad in (-1, V.size + 1, 1 << 16):
        with pytest.raises(ValueError):
            P.label_names([bad])
    f = P.figures([[w, lx], [w], [], [0], [cu, w]])
    assert f["documents"] == 5 and f["labelled_documents"] == 3 and f["labels_assigned"] == 5
    assert f["per_label"] == {"os.windows": 3, "gpu.cuda": 1, "os.linux": 1}
    assert list(f["per_label"]) == ["os.windows", "gpu.cuda", "os.linux"]  # count, then name
    assert f["per_category"]["os"] == 3 and f["per_category"]["gpu"] == 1 and f["per_category"]["rtos"] == 0
    assert f["max_labels_per_document"] == 2 and f["mean_labels_per_document"] == 1.0
    assert f["vocabulary"] == "v1" and f["vocabulary_sha256"] == V.sha256 and f["labels"] == V.size
    json.dumps(f)
    with pytest.raises(ValueError):
        P.figures([[V.size + 1]])


# --------------------------------------------------------------------------------------------
# real corpus files


def _source_files(manifest: str, name: str) -> dict[str, bytes]:
    src = load_manifest(manifest).source(name)
    return dict(acquire.acquire_source(src, SHARED_CACHE).files)


@pytest.fixture(scope="module")
def llama():
    files = _source_files("large", "llama-cpp-python-0.3.36")
    return {p: d.decode("utf-8", "surrogateescape") for p, d in files.items()}


LLAMA_GGML = "vendor/llama.cpp/ggml/src/"


def _has(text: str, name: str) -> bool:
    return V.id_of(name) in P.scan_platforms(text)


@pytest.mark.integration
def test_llama_cpp_cuda_sources_get_the_cuda_label(llama):
    cu = {p: t for p, t in llama.items() if p.startswith(LLAMA_GGML + "ggml-cuda/") and p.endswith((".cu", ".cuh"))}
    assert sum(p.endswith(".cu") for p in cu) >= 150  # the backend and its template instances
    missing = [p for p, t in cu.items() if not _has(t, "gpu.cuda")]
    assert missing == []
    hip = llama[LLAMA_GGML + "ggml-cuda/vendors/hip.h"]
    assert _has(hip, "gpu.hip") and _has(hip, "arch.amdgcn")


@pytest.mark.integration
def test_llama_cpp_metal_sources_get_the_metal_and_apple_labels(llama):
    metal = {p: t for p, t in llama.items() if p.startswith(LLAMA_GGML + "ggml-metal/")}
    shaders = [p for p in metal if p.endswith(".metal")]
    objc = [p for p in metal if p.endswith(".m")]
    assert len(shaders) >= 20 and len(objc) >= 2
    # Metal shading language sources (scanned as text; the extension whitelist keeps them out
    # of training). The unlabelled ones only instantiate templates of fa_vec_common.metal.
    instance_only = [p for p in shaders if not _has(metal[p], "gpu.metal")]
    assert all('#include "fa_vec_common.metal"' in metal[p] for p in instance_only)
    assert len(instance_only) <= len(shaders) // 4
    for p in objc:  # Objective-C host code: the Metal API on Apple platforms
        assert _has(metal[p], "gpu.metal") and _has(metal[p], "os.apple"), p
    for p in ("kernels/common.h", "ggml-metal-device.h", "ggml-metal-impl.h", "ggml-metal-device.cpp",
              "ggml-metal-ops.cpp"):
        assert _has(metal[LLAMA_GGML + "ggml-metal/" + p], "gpu.metal"), p
    assert not any(_has(t, "gpu.cuda") for p, t in metal.items() if acquire.language_of(p))


@pytest.mark.integration
def test_llama_cpp_cpu_backends_get_their_architectures(llama):
    x86 = names(llama[LLAMA_GGML + "ggml-cpu/arch/x86/quants.c"])
    assert {"arch.avx", "arch.avx2", "arch.avx512", "arch.fma", "arch.sse2", "arch.ssse3"} <= set(x86)
    assert not set(x86) & {"arch.neon", "gpu.cuda", "arch.rvv"}
    arm = names(llama[LLAMA_GGML + "ggml-cpu/arch/arm/quants.c"])
    assert {"arch.neon", "arch.arm_dotprod", "arch.sve"} <= set(arm) and "arch.avx2" not in arm
    assert "arch.rvv" in names(llama[LLAMA_GGML + "ggml-cpu/arch/riscv/quants.c"])
    assert "arch.vsx" in names(llama[LLAMA_GGML + "ggml-cpu/arch/powerpc/quants.c"])
    assert "arch.wasm_simd" in names(llama[LLAMA_GGML + "ggml-cpu/arch/wasm/quants.c"])
    assert {"arch.x86", "arch.x86_64"} <= set(names(llama[LLAMA_GGML + "ggml-cpu/arch/x86/cpu-feats.cpp"]))
    # a plain, portable file: no platform at all
    assert P.scan_platforms(llama[LLAMA_GGML + "ggml-alloc.c"]) == []
    assert "gpu.vulkan" in names(llama[LLAMA_GGML + "ggml-vulkan/ggml-vulkan.cpp"])
    assert "gpu.sycl" in names(llama[LLAMA_GGML + "ggml-sycl/ggml-sycl.cpp"])
    assert "gpu.opencl" in names(llama[LLAMA_GGML + "ggml-opencl/ggml-opencl.cpp"])


@pytest.mark.integration
def test_llama_cpp_whole_source_figures(llama):
    docs = [t for p, t in sorted(llama.items()) if acquire.language_of(p)]
    ids = P.scan_many(docs)
    assert len(ids) > 1000 and all(len(x) <= 20 and all(1 <= i <= V.size for i in x) for x in ids)
    f = P.figures(ids)
    top = list(f["per_label"])[:10]
    assert "gpu.cuda" in top[:3] and "std.cxx11" in top
    assert f["per_label"]["gpu.cuda"] >= 250 and f["per_label"]["gpu.sycl"] >= 50
    assert f["at_cap"] >= 1 and f["max_labels_per_document"] == 20
    assert P.scan_many(docs[:50]) == ids[:50]


@pytest.mark.integration
def test_xxhash_labels():
    files = _source_files("default", "xxhash-4.1.0")
    text = {p: d.decode("utf-8") for p, d in files.items() if acquire.language_of(p)}
    header = names(text["deps/xxhash/xxhash.h"])
    # a portability header: 36 labels found, the 20 with the most evidence kept
    assert len(P.evidence(text["deps/xxhash/xxhash.h"])) > 20 and len(header) == 20
    assert {"arch.avx2", "arch.avx512", "arch.sse2", "arch.neon", "arch.sve", "compiler.msvc", "compiler.gcc",
            "compiler.clang", "os.windows", "std.c99"} <= set(header)
    dispatch = names(text["deps/xxhash/xxh_x86dispatch.c"])
    assert {"arch.x86", "arch.x86_64", "arch.avx2", "arch.avx512", "compiler.msvc"} <= set(dispatch)
    assert "arch.neon" not in dispatch
    assert names(text["deps/xxhash/xxh_x86dispatch.h"]) == ["os.windows", "compiler.msvc"]
    assert P.scan_platforms(text["src/_xxhash.c"]) == []  # the Python binding: portable


# --------------------------------------------------------------------------------------------
# the scanner against a reference: one automaton, one regex pass over the whole text


def _reference_matches(text: str) -> list[tuple[int, tuple[int, ...], str]]:
    """The matches as the scanner made them before it used hyperscan and windows: a
    pyahocorasick automaton of every indicator, then ``VERSION_TEST.finditer`` over the
    whole text."""
    import ahocorasick

    auto = ahocorasick.Automaton()
    for ind in V.indicators:
        auto.add_word(ind.text, ind)
    auto.make_automaton()
    ident = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
    std_ids = {name: i for i, name, _ in V.labels if name.startswith("std.")}
    out = []
    for end, ind in auto.iter(text):
        start = end - len(ind.text) + 1
        if ind.text[0] in ident and start > 0 and text[start - 1] in ident:
            continue
        if not ind.prefix and ind.text[-1] in ident and end + 1 < len(text) and text[end + 1] in ident:
            continue
        out.append((start, ind.label_ids, ind.text))
    for m in P.VERSION_TEST.finditer(text):
        if m.group(1):
            macro, op, value = m.group(1), m.group(2), int(m.group(3))
        else:
            macro, op, value = m.group(6), P._FLIP[m.group(5)], int(m.group(4))
        name = P.standard_for_test(macro, op, value)
        if name in std_ids:
            out.append((m.start(), (std_ids[name],), f"{macro} {op} {value}"))
    return out


#: Pieces of hostile texts: the version macros, glued and split, every character a standard
#: test may hold (Unicode whitespace included), identifiers, indicators, non-ASCII text.
_PIECES = ("__cplusplus", "_MSVC_LANG", "__STDC_VERSION__", "__cplusplus__", "x__cplusplus", ">=", ">", "<", "<=",
           "==", "!=", "=", "(", ")", " ", "\t", "\n", "\x1c", "\x85", "\u3000", "\u00a0", "201703", "201402L",
           "199901UL", "2017031", "20170", "l", "u", "UL", "LLU", "x", "_", "é", "日本", "😀", "\udcff", "__linux__",
           "_WIN32", "__m128i", "_mm256_add_epi32", "std::move", "#if ", "defined", "&&", "||")


@pytest.mark.parametrize("engine", ["hyperscan", "automaton"])
def test_scanner_equals_the_reference_on_hostile_texts(engine, monkeypatch):
    """Either engine of the literal scanner (pyahocorasick when hyperscan is not installed;
    ``_MSVC_LANG`` is an indicator and a version macro: one literal, two ids)."""
    import random

    from megacpp_core import keyscan

    if engine == "automaton":
        monkeypatch.setattr(keyscan, "hyperscan", None)
    monkeypatch.setattr(P, "_SCANNERS", {})
    assert names("#ifdef _MSVC_LANG\n#endif") == ["compiler.msvc"]
    assert names("#if _MSVC_LANG >= 201703L") == ["compiler.msvc", "std.cxx17"]
    rng = random.Random(1927)
    for _ in range(3000):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 40)))
        assert sorted(P._scanner(None).matches(text)) == sorted(_reference_matches(text)), text
        assert P.explain(text) == _reference_explain(text), text  # the order among equal starts too


def _reference_explain(text: str) -> dict[str, list[str]]:
    """:func:`megacpp_core.platforms.explain` over :func:`_reference_matches`."""
    hits: dict[int, tuple[int, list[str]]] = {}
    for start, ids, what in sorted(_reference_matches(text), key=lambda m: m[0]):
        for i in ids:
            _, words = hits.setdefault(i, (start, []))
            if what not in words:
                words.append(what)
    return {V.name_of(i): words for i, (_, words) in sorted(hits.items(), key=lambda kv: (kv[1][0], kv[0]))}


@pytest.mark.integration
def test_scanner_equals_the_reference_on_real_files():
    files = _source_files("tiny", "xxhash-4.1.0") | _source_files("tiny", "pybind11-3.1.0")
    texts = [d.decode("utf-8", "surrogateescape") for p, d in sorted(files.items()) if acquire.language_of(p)]
    assert len(texts) > 100 and any(not t.isascii() for t in texts)
    assert sum("__cplusplus" in t for t in texts) >= 5  # standard tests searched in windows
    for t in texts:
        assert sorted(P._scanner(None).matches(t)) == sorted(_reference_matches(t))
        assert P.explain(t) == _reference_explain(t)
