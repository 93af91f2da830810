"""Benchmark: the stage-3 scrub now vs a baseline revision, on the default corpus texts.

Texts: every file of the ``default`` corpus sdists (read from the shared cache under
``data/cache``) that the stage-1 quality filters keep, decoded as the stage does: the
exact input of the scrub stage.

For both the baseline (``megacpp_core/scrub.py`` at ``--baseline-ref``, loaded from git;
default: the parent of the commit that added ``megacpp_core/keyscan.py``) and the
working tree, it reports:

``seconds``
    ``scrub_text`` over all texts (redaction plus the fail-closed re-scan), best of
    ``--repeat`` runs, and the redaction pass alone (``_spans``).
``redactions``
    count per kind.

and the difference between the two: ``files_changed`` (texts whose scrubbed output
differs), ``chars_changed`` per kind (characters of the input covered by a redaction of
that kind in one version and not the other, both directions), and every value redacted
by one version only (``new_only``/``baseline_only``: kind, source, path, value; these are
real constants of the corpus, public code).

``rescan``: findings of the stricter re-scan on the new outputs (the scrub raises on
any; 0 expected) and tokens of the raw texts that only the re-scan's looser entropy
threshold flags (``margin_tokens``: what would make the stage fail closed).

``--calibrate`` instead prints the share of random tokens (base64, base62, base64url;
20-86 characters; ``--samples`` each, seeded) that the generic rule misses, with the
thresholds in force.

Usage::

    python bench/scrub_secrets.py [--repeat 3] [--baseline-ref REF] [--all-files]
    python bench/scrub_secrets.py --calibrate [--samples 20000]
"""

from __future__ import annotations

import argparse
import json
import random
import string
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from megacpp_core import keyscan, leak_rescan, scrub  # noqa: E402


def corpus_texts(all_files: bool = False) -> list[tuple[str, str, str]]:
    """``(source, path, text)`` of the kept files of the default corpus, in order (with
    ``all_files``: every UTF-8 text file of the sdists up to 1 MB instead: docs, tests,
    Python, JSON fixtures)."""
    from megacpp_core.acquire import acquire_source
    from megacpp_core.manifest import load_manifest
    from megacpp_core.quality import check_file

    manifest = load_manifest("default")
    out = []
    for src in manifest.sources:
        for path, data in acquire_source(src, ROOT / "data" / "cache").files:
            if all_files:
                try:
                    text = data.decode("utf-8") if len(data) <= 1_000_000 and b"\0" not in data else None
                except UnicodeDecodeError:
                    text = None
            else:
                text, _ = check_file(path, data, manifest.settings)
            if text is not None:
                out.append((src.name, path, text))
    return out


def default_baseline_ref() -> str:
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "megacpp_core/keyscan.py"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return (added[-1] + "^") if added else "HEAD"


def load_baseline(ref: str) -> types.ModuleType:
    src = subprocess.run(["git", "show", f"{ref}:megacpp_core/scrub.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    mod = types.ModuleType("scrub_baseline")
    mod.__dict__["__name__"] = "scrub_baseline"
    sys.modules["scrub_baseline"] = mod  # dataclasses look the module up
    exec(compile(src, f"{ref}:megacpp_core/scrub.py", "exec"), mod.__dict__)
    return mod


def _best(fn, texts, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _, _, text in texts:
            fn(text)
        best = min(best, time.perf_counter() - t0)
    return round(best, 3)


def _coverage(spans, kind: str) -> set[int]:
    cov: set[int] = set()
    for s, e, k, _ in spans:
        if k == kind:
            cov.update(range(s, e))
    return cov


def compare(texts, base, repeat: int) -> dict:
    kinds = scrub.KINDS
    res = {"texts": len(texts), "chars": sum(len(t) for _, _, t in texts)}
    for name, mod in (("baseline", base), ("new", scrub)):
        counts = Counter()
        for _, _, text in texts:
            for k, v in mod.scrub_text(text).counts.items():
                counts[k] += v
        res[name] = {
            "seconds_scrub_text": _best(mod.scrub_text, texts, repeat),
            "seconds_redaction_pass": _best(mod._spans, texts, repeat),
            "redactions": {k: counts[k] for k in kinds},
        }
    res["speedup_scrub_text"] = round(res["baseline"]["seconds_scrub_text"] / res["new"]["seconds_scrub_text"], 2)
    files_changed, chars = 0, {k: {"new_only": 0, "baseline_only": 0} for k in kinds}
    new_only, base_only = [], []
    for source, path, text in texts:
        if base.scrub_text(text).text != scrub.scrub_text(text).text:
            files_changed += 1
        bs, ns = base._spans(text), scrub._spans(text)
        for k in kinds:
            b, n = _coverage(bs, k), _coverage(ns, k)
            chars[k]["new_only"] += len(n - b)
            chars[k]["baseline_only"] += len(b - n)
        bset = {(s, e) for s, e, _, _ in bs}
        nset = {(s, e) for s, e, _, _ in ns}
        new_only += [{"kind": k, "source": source, "path": path, "value": text[s:e]} for s, e, k, _ in ns if (s, e) not in bset]
        base_only += [{"kind": k, "source": source, "path": path, "value": text[s:e]} for s, e, k, _ in bs if (s, e) not in nset]
    res["diff"] = {"files_changed": files_changed, "files_total": len(texts), "chars_changed": chars,
                   "new_only": new_only, "baseline_only": base_only}
    marker = scrub.REDACTION_MARKERS["secret"]
    left = sum(len(leak_rescan.strict_findings(scrub.scrub_text(t).text, marker)) for _, _, t in texts)
    margin = []
    for source, path, text in texts:
        strict = set(keyscan.generic_spans(text, keyscan.STRICT_MARGIN)) - set(keyscan.generic_spans(text))
        margin += [{"source": source, "path": path, "value": text[s:e]} for s, e in sorted(strict)]
    res["rescan"] = {"findings_after_scrub": left, "margin_tokens": margin}
    return res


def calibrate(samples: int, seed: int = 7) -> dict:
    rng = random.Random(seed)
    a62 = string.ascii_letters + string.digits
    mixed = (string.ascii_uppercase, string.ascii_lowercase, string.digits)
    out = {}
    for name, alphabet in (("base64", a62 + "+/"), ("base62", a62), ("base64url", a62 + "_-")):
        for n in (20, 24, 32, 40, 52, 64, 86):
            toks = []
            while len(toks) < samples:
                t = "".join(rng.choice(alphabet) for _ in range(n))
                if all(any(c in cls for c in t) for cls in mixed):
                    toks.append(t)
            out[f"{name}_{n}"] = {
                "miss_rate": sum(not keyscan.random_like(t) for t in toks) / samples,
                "miss_rate_rescan": sum(not keyscan.random_like(t, keyscan.STRICT_MARGIN) for t in toks) / samples,
                "entropy_bar": round(keyscan.expected_entropy(n) - keyscan.entropy_slack(n), 3),
                "structure_limit": round(keyscan.structure_limit(n), 3),
            }
    return {"samples": samples, "seed": seed, "generic": out}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-ref", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--all-files", action="store_true", help="every text file of the sdists, not only the kept ones")
    ap.add_argument("--samples", type=int, default=20000)
    args = ap.parse_args(argv)
    if args.calibrate:
        result = calibrate(args.samples)
    else:
        ref = args.baseline_ref or default_baseline_ref()
        texts = corpus_texts(args.all_files)
        result = {"baseline_ref": subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True,
                                                 text=True, check=True).stdout.strip(), **compare(texts, load_baseline(ref), args.repeat)}
    print(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main()
