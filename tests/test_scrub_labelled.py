"""Recall and false-redaction rate of the secret scrub on the labelled set.

``tests/data/scrub_labelled.jsonl`` (built by ``bench/scrub_labelled_set.py``) holds
synthetic secrets of every format planted in C/C++ and config contexts, the private test
key the ``pygit2`` sdist ships, and real non-secret constants cut from the default
corpus sdists (hex digests, 64-bit hex literals, UUIDs, lookup tables, version strings,
long identifiers with digits, long test strings, an SSH public key, a PGP signature).

Recall: share of secret records whose every planted value is gone after the scrub.
False-redaction rate: share of real constants where the scrub redacted a *secret*
(other kinds, e.g. an author e-mail in the same window, are not counted here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megacpp_core import leak_rescan
from megacpp_core.scrub import REDACTION_MARKERS, find_leaks, scrub_text

DATA = Path(__file__).parent / "data" / "scrub_labelled.jsonl"
#: Highest false-redaction rate accepted on the labelled real constants.
MAX_FALSE_REDACTION_RATE = 0.02


@pytest.fixture(scope="module")
def records():
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def outcome(records):
    """Per record: the scrub result (the scrub raises LeakError if its re-scan fails)."""
    return {r["id"]: scrub_text(r["text"], max_samples=0) for r in records}


def test_set_covers_every_family_and_context(records):
    secrets = [r for r in records if r["label"] == "secret"]
    keeps = [r for r in records if r["label"] == "keep"]
    assert len({r["family"] for r in secrets}) >= 40
    assert len({r["context"] for r in secrets}) >= 16
    assert {"hex_digest", "hex_literal_64", "uuid", "lookup_table", "version_string", "long_identifier",
            "long_test_string", "ssh_public_key", "pgp_signature"} <= {r["kind"] for r in keeps}
    assert len({r["source"] for r in keeps}) >= 10 and len(keeps) >= 150


def test_recall_and_false_redaction_rate(records, outcome):
    secrets = [r for r in records if r["label"] == "secret"]
    keeps = [r for r in records if r["label"] == "keep"]
    missed = [(r["id"], r["family"], r["context"]) for r in secrets
              if any(v in outcome[r["id"]].text for v in r["secrets"])]
    false = [(r["id"], r["kind"], r["path"]) for r in keeps if outcome[r["id"]].counts["secret"]]
    recall = 1 - len(missed) / len(secrets)
    rate = len(false) / len(keeps)
    print(f"\nscrub labelled set: {len(secrets)} secret records, recall {recall:.4f}; "
          f"{len(keeps)} real constants, false-redaction rate {rate:.4f}")
    assert recall == 1.0, f"missed {len(missed)}: {missed[:5]}"
    assert rate <= MAX_FALSE_REDACTION_RATE, f"false redactions: {false[:5]}"


def test_secret_records_are_counted_and_leave_nothing(records, outcome):
    for r in records:
        res = outcome[r["id"]]
        if r["label"] == "secret":
            assert res.counts["secret"] >= 1, r["id"]
            assert REDACTION_MARKERS["secret"] in res.text
        assert find_leaks(res.text) == [], r["id"]
        assert scrub_text(res.text).text == res.text, r["id"]  # idempotent


def test_fail_closed_check_sees_every_raw_secret(records):
    """The fail-closed check (:func:`find_leaks`: the redaction rules re-run plus the
    stricter re-scan) flags every raw secret record: had the redaction missed one, the
    scrub would have raised instead of emitting it."""
    unseen = [r["id"] for r in records if r["label"] == "secret" and not find_leaks(r["text"])]
    assert not unseen, unseen[:10]


#: Families detect-secrets' own plugins know (its AWS, GitHub, GitLab, Slack, Stripe,
#: OpenAI, PyPI, SendGrid, Twilio, Mailchimp, Square, Discord, Telegram, JWT, Azure and
#: private-key plugins).
DETECT_SECRETS_FAMILIES = (
    "aws_access_key_id", "github_pat", "gitlab_pat", "slack_bot_token", "slack_webhook", "stripe_live_secret",
    "openai_key", "pypi_token", "sendgrid_key", "twilio_api_key", "mailchimp_key", "square_oauth_secret",
    "discord_bot_token", "telegram_bot_token", "jwt", "azure_storage_key", "private_key_rsa_private_key",
    "private_key_ec_private_key", "private_key_private_key", "private_key_openssh_private_key",
    "private_key_real_test_key",
)


def test_rescan_is_independent_of_the_redaction_rules(records):
    """The re-scan's own detectors, without the redaction rules: detect-secrets' plugins
    flag every record of the formats they know, and the looser generic test flags every
    generic key."""
    marker = REDACTION_MARKERS["secret"]
    for r in records:
        if r["label"] != "secret":
            continue
        names = {name for name, _ in leak_rescan.strict_findings(r["text"], marker)}
        if r["family"] in DETECT_SECRETS_FAMILIES:
            assert names - {"GenericHighEntropy"}, (r["id"], r["family"], r["context"])
        if r["family"].startswith("generic_") or r["family"] == "aws_secret_access_key":
            assert "GenericHighEntropy" in names, (r["id"], r["family"], r["context"])
