"""Benchmark of the stage-3 scrub against one combined ``re`` pass of its own detectors
(prints one JSON object).

    python bench/scrub.py [--data-root DIR] [--corpus default] [--cache data/cache] [--repeat 3] [--code DIR]

Input: the scrub's input, the quality-kept texts of the corpus: every
``revisions/*/shards/*/quality_kept.parquet`` under ``--data-root`` (a data root after
``megacpp run --corpus default``), else the corpus sdists read from the cache through
``megacpp_core.acquire`` and kept by ``megacpp_core.quality.check_file`` (what the
quality stage keeps).

Timed in this one process on the same texts, wall seconds, best of ``--repeat``:

``baseline``
    One Python ``re`` pattern, the alternation of every redaction detector's regex
    (:func:`detector_patterns`: the PEM block, each issuer format of
    ``keyscan.FORMAT_RULES``, the prefix-less formats (Twilio, Artifactory, Discord,
    Telegram, Mailchimp), URL passwords, secret-named assignments (the whole-line form
    anchored at line starts, where the scrub tries it), the generic base64 run, e-mail,
    home path, IPv6, IPv4 and the redaction markers; group numbers and names renumbered
    so that back-references still work), ``finditer`` over each text, every match
    consumed, nothing else done with it.
``baseline_with_rescan``
    The same pattern plus the regexes of the detect-secrets plugins the re-scan runs.
``ours``
    ``scrub.scrub_text`` on each text: redaction, its replacements and the fail-closed
    re-scan of the output (a text the re-scan flags counts; ``failed_closed``).
``ours_gate``
    ``scrub.find_leaks`` on every output, as the stage's ``rescan_finds_nothing`` gate
    re-reads the committed texts.

Ratios are speed ratios: ``ours_over_baseline`` = baseline seconds / ours seconds (goal
of issue 19: >= 2). ``engines``: whether google-re2 and hyperscan, when importable,
compile each detector regex (the combined pattern needs look-behinds and
back-references, which neither supports), and their time for one pass of the
detectors they do compile.

``--code DIR`` measures the ``megacpp_core`` under ``DIR`` (e.g. a ``git archive`` of an
older revision) with this script's baseline; the detector regexes are read from it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kept_texts(data_root: Path | None, corpus: str, cache: Path) -> list[str]:
    """The scrub stage's input texts, in a fixed order."""
    if data_root is not None:
        import pyarrow.parquet as pq

        files = sorted(data_root.glob("**/revisions/*/shards/*/quality_kept.parquet"))
        if not files:
            raise SystemExit(f"no quality_kept.parquet under {data_root}")
        return [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    from megacpp_core.acquire import acquire_source
    from megacpp_core.manifest import load_manifest
    from megacpp_core.quality import check_file

    manifest = load_manifest(corpus)
    out = []
    for src in manifest.sources:
        for path, data in acquire_source(src, cache).files:
            text, _ = check_file(path, data, manifest.settings)
            if text is not None:
                out.append(text)
    return out


def detector_patterns() -> list[tuple[str, re.Pattern]]:
    """``(name, regex)`` of every redaction detector, as the scrub applies it."""
    from megacpp_core import keyscan as k
    from megacpp_core import scrub as s

    line = s._ASSIGN_LINE.pattern
    assert line.startswith("(?i)")
    pats = [("pem", s._PEM)]
    pats += [(name, re.compile(rx)) for name, _, rx, _ in k.FORMAT_RULES]
    pats += [
        ("twilio_key", k._TWILIO), ("artifactory_token", k._ARTIFACTORY),
        ("discord_token", re.compile(k._DISCORD_HEAD.pattern + k._DISCORD_TAIL.pattern)),
        ("telegram_token", re.compile(k._TELEGRAM_HEAD.pattern + k._TELEGRAM_TAIL.pattern)),
        ("mailchimp_key", k._MAILCHIMP), ("basic_auth_password", s._BASIC_AUTH), ("assignment", s._ASSIGN),
        ("assignment_line", re.compile(f"(?m)^(?i:{line[4:]})")), ("generic_run", k._RUN), ("email", s._EMAIL),
        ("home_path", s._HOME), ("ipv6", s._V6), ("ipv4", s._V4), ("marker", s._MARKER),
    ]
    return pats


def rescan_patterns() -> list[tuple[str, re.Pattern]]:
    """``(plugin, regex)`` of the detect-secrets plugins of the re-scan."""
    from megacpp_core import leak_rescan

    return [(name, rx) for name, plugin, _ in leak_rescan._strict_plugins() for rx in plugin.denylist]


def _renumbered(pattern: str, k: int, offset: int, flags: int) -> str:
    """``pattern`` as one branch of an alternation: numbered back-references shifted by
    ``offset``, group names suffixed with ``k``, leading global flags (and the
    pattern's compile flags) scoped to the branch."""
    m = re.match(r"\(\?([aiLmsux]+)\)", pattern)
    inline = m.group(1) if m else ""
    p = pattern[m.end():] if m else pattern
    inline += "i" if flags & re.IGNORECASE and "i" not in inline else ""
    inline += "s" if flags & re.DOTALL and "s" not in inline else ""
    inline += "m" if flags & re.MULTILINE and "m" not in inline else ""
    out, i, n, in_class = [], 0, len(p), False
    while i < n:
        c = p[i]
        if c == "\\":
            j = i + 1
            if not in_class and p[j].isdigit() and p[j] != "0":
                while j < n and p[j].isdigit():
                    j += 1
                out.append("\\" + str(int(p[i + 1 : j]) + offset))
                i = j
                continue
            out.append(p[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            for lead in ("^", "]"):
                if p[i : i + 1] == lead:
                    out.append(lead)
                    i += 1
            continue
        if p.startswith("(?P<", i):
            j = p.index(">", i)
            out.append(f"(?P<{p[i + 4 : j]}_{k}>")
            i = j + 1
            continue
        if p.startswith("(?P=", i):
            j = p.index(")", i)
            out.append(f"(?P={p[i + 4 : j]}_{k})")
            i = j + 1
            continue
        out.append(c)
        i += 1
    body = "".join(out)
    return f"(?{''.join(sorted(set(inline)))}:{body})" if inline else f"(?:{body})"


def combined(patterns: list[tuple[str, re.Pattern]]) -> re.Pattern:
    parts, offset = [], 0
    for k, (_, rx) in enumerate(patterns):
        parts.append(_renumbered(rx.pattern, k, offset, rx.flags))
        offset += rx.groups
    return re.compile("|".join(parts))


def _consume(rx: re.Pattern, texts: list[str]) -> int:
    n = 0
    for text in texts:
        for _ in rx.finditer(text):
            n += 1
    return n


def engines(patterns: list[tuple[str, re.Pattern]], texts: list[str], repeat: int) -> dict:
    """google-re2 and hyperscan on the detector regexes: which compile, and one pass of
    those that do over the same texts (the pass finds candidates only)."""
    out: dict = {}
    data = [t.encode("utf-8", "surrogatepass") for t in texts]
    try:
        import re2

        ok, failed = [], []
        for name, rx in patterns:
            try:
                re2.compile(rx.pattern)
                ok.append((name, rx))
            except Exception:  # noqa: BLE001 - re2 raises its own error types
                failed.append(name)
        one = re2.compile("|".join(f"(?:{rx.pattern})" for _, rx in ok))

        def run_re2():
            for d in data:
                for _ in one.finditer(d):
                    pass

        out["google-re2"] = {"compiled": len(ok), "refused": failed, "seconds_compiled_ones": round(_best(run_re2, repeat), 3)}
    except ImportError:
        out["google-re2"] = "not installed"
    try:
        import hyperscan

        ok, failed = [], []
        for name, rx in patterns:
            db = hyperscan.Database()
            try:
                db.compile(expressions=[rx.pattern.encode()], ids=[0], elements=1)
                ok.append((name, rx))
            except Exception:  # noqa: BLE001 - hyperscan.error
                failed.append(name)
        db = hyperscan.Database()
        db.compile(expressions=[rx.pattern.encode() for _, rx in ok], ids=list(range(len(ok))), elements=len(ok),
                   flags=[hyperscan.HS_FLAG_SINGLEMATCH] * len(ok))

        def run_hs():
            for d in data:
                db.scan(d, match_event_handler=lambda *a: None)

        out["hyperscan"] = {"compiled": len(ok), "refused": failed, "seconds_compiled_ones_singlematch": round(_best(run_hs, repeat), 3)}
    except ImportError:
        out["hyperscan"] = "not installed"
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", type=Path, default=None)
    ap.add_argument("--corpus", default="default")
    ap.add_argument("--cache", type=Path, default=ROOT / "data" / "cache")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--code", type=Path, default=ROOT, help="directory whose megacpp_core is measured")
    ap.add_argument("--no-engines", action="store_true", help="skip the google-re2 / hyperscan measurements")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.code.resolve()))
    from megacpp_core import scrub

    texts = kept_texts(args.data_root, args.corpus, args.cache)
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    detectors = detector_patterns()
    base = combined(detectors)
    base_rescan = combined(detectors + rescan_patterns())
    outputs: list[str] = []
    failed: list[int] = []

    def ours():
        outputs.clear()
        failed.clear()
        for i, text in enumerate(texts):
            try:
                outputs.append(scrub.scrub_text(text).text)
            except scrub.LeakError:
                failed.append(i)

    def gate():
        for text in outputs:
            scrub.find_leaks(text)

    ours()  # warm-up: detect-secrets import, automata, compiled regexes
    t_base = _best(lambda: _consume(base, texts), args.repeat)
    t_base_rescan = _best(lambda: _consume(base_rescan, texts), args.repeat)
    t_ours = _best(ours, args.repeat)
    t_gate = _best(gate, args.repeat)
    result = {
        "code": str(args.code.resolve()),
        "texts": len(texts), "mb": round(mb, 3), "repeat": args.repeat,
        "detectors": len(detectors), "baseline_matches": _consume(base, texts),
        "baseline": {"seconds": round(t_base, 3), "mb_per_s": round(mb / t_base, 3)},
        "baseline_with_rescan": {"seconds": round(t_base_rescan, 3), "mb_per_s": round(mb / t_base_rescan, 3),
                                 "regexes": len(detectors) + len(rescan_patterns())},
        "ours": {"seconds": round(t_ours, 3), "mb_per_s": round(mb / t_ours, 3), "failed_closed": len(failed)},
        "ours_gate": {"seconds": round(t_gate, 3), "mb_per_s": round(mb / t_gate, 3)},
        "ratios": {"ours_over_baseline": round(t_base / t_ours, 2),
                   "ours_over_baseline_with_rescan": round(t_base_rescan / t_ours, 2),
                   "ours_gate_over_baseline": round(t_base / t_gate, 2)},
        "goal_ours_over_baseline": 2.0,
    }
    if not args.no_engines:
        result["engines"] = engines(detectors, texts, args.repeat)
    print(json.dumps(result, indent=1, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
