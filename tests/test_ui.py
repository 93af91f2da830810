"""The Dagster UI in a real browser: headless Chromium driven by Playwright.

Starts ``dagster dev`` (webserver + daemon) on 127.0.0.1 with the ``tiny`` snapshot's
partitions registered, opens the asset graph, launches a materialization of one
``repo_revision`` partition of ``source_files`` from the UI, waits for the run to
succeed, then reads an asset check result and a metadata value from the page, and saves
screenshots under ``data/test-artifacts/``. On a materialized ``tiny``: the "unsynced"
tag of a new code version, the revision × shard grid of a per-document asset, the
curriculum plots (inline PNG images in markdown metadata), and a backfill of the
snapshot's revision × shard partitions launched from the UI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PROJECT, free_port, make_data_root, write_instance_config

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = PROJECT / "data" / "test-artifacts"
PARTITION = "tiny/lz4-4.4.5"


def _open_page(p):
    """Headless Chromium (the flags the machine needs) and one 1400×900 page, 60 s timeouts."""
    browser = p.chromium.launch(executable_path=CHROMIUM, args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    return browser, page


def _dismiss_welcome(page) -> None:
    """Close the UI's first-visit dialog when it shows."""
    page.wait_for_timeout(1500)
    if page.get_by_role("button", name="Skip").count():
        page.get_by_role("button", name="Skip").click()


@pytest.fixture(scope="module")
def webserver(tmp_path_factory):
    from dagster import DagsterInstance

    root = make_data_root(tmp_path_factory.mktemp("ui-root"))
    home = root / "dagster_home"
    home.mkdir()
    write_instance_config(home)
    env = {**os.environ, "DAGSTER_HOME": str(home), "MEGACPP_DATA_ROOT": str(root)}
    env.pop("MEGACPP_PROFILE", None)
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            instance.add_dynamic_partitions("snapshot", ["tiny"])
            instance.add_dynamic_partitions("repo_revision", ["tiny/pybind11-3.1.0", PARTITION, "tiny/xxhash-4.1.0"])
    finally:
        os.environ.pop("DAGSTER_HOME", None)
    yield from _serve(env, PROJECT / "workspace.yaml", root / "dagster-dev.log")


def test_materialize_a_partition_from_the_ui(webserver):
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).exists(), "Chromium is not installed (make test installs Debian's chromium)"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open_page(p)

        # the asset graph: both groups and the fan-in edge are there
        page.goto(f"{webserver}/asset-groups", wait_until="networkidle")
        _dismiss_welcome(page)
        page.goto(f"{webserver}/locations/megacpp_assets.definitions:defs/asset-groups/snapshot", wait_until="networkidle")
        expect(page.get_by_text("dedup_decisions").first).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "ui-asset-graph.png"))

        # launch one partition of source_files from the asset page
        page.goto(f"{webserver}/assets/source_files", wait_until="networkidle")
        _dismiss_welcome(page)
        page.get_by_role("button", name="Materialize…").click()
        page.get_by_text("Select a partition or create one").click()
        page.get_by_placeholder("Filter partitions").fill(PARTITION)
        page.locator("label:visible", has_text=PARTITION).first.click()
        page.keyboard.press("Escape")
        page.get_by_role("button", name="Launch 1 run").click()
        toast = page.get_by_text("Launched run").first
        toast.wait_for()
        short_id = toast.inner_text().split()[-1]

        # wait for the run to succeed on its run page
        page.goto(f"{webserver}/runs", wait_until="networkidle")
        page.get_by_role("link", name=short_id).first.click()
        page.wait_for_url("**/runs/**")
        expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=240_000)

        # a check result and a metadata value, read from the page
        page.goto(f"{webserver}/assets/source_files?view=checks", wait_until="networkidle")
        page.get_by_text("hash_matches_pin").first.click()
        expect(page.get_by_text("Passed").first).to_be_visible()
        page.goto(f"{webserver}/assets/source_files?view=partitions&partition={PARTITION.replace('/', '%2F')}",
                  wait_until="networkidle")
        row = page.locator("tr", has=page.get_by_text("files", exact=True)).first
        expect(row).to_contain_text("78")  # lz4 4.4.5's sdist holds 78 files
        page.screenshot(path=str(ARTIFACTS / "ui-materialized.png"))
        browser.close()
    assert (ARTIFACTS / "ui-materialized.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def bumped_webserver(fresh_tiny, tmp_path_factory):
    """``dagster dev`` on the materialized ``fresh_tiny`` instance, loading the code location
    with the tokenize stage's code version changed (tests/ui_bumped_defs.py)."""
    root, _, home = fresh_tiny
    work = tmp_path_factory.mktemp("ui-bumped")
    (work / "workspace.yaml").write_text("load_from:\n  - python_module:\n      module_name: tests.ui_bumped_defs\n"
                                         f"      attribute: defs\n      working_directory: {PROJECT}\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "MEGACPP_DATA_ROOT": str(root), "PYTHONPATH": str(PROJECT)}
    env.pop("MEGACPP_PROFILE", None)
    yield from _serve(env, work / "workspace.yaml", work / "dagster-dev.log")


def _serve(env: dict, workspace: Path, log_path: Path):
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "-h", "127.0.0.1",
                             "-p", str(port)], cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if urllib.request.urlopen(f"{url}/server_info", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, f"dagster dev exited: {log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "dagster dev did not come up"
            time.sleep(2)
        # the first-visit dialog opens a second after the page asks the instance whether it
        # should: on a loaded machine that can be after any fixed wait, and the dialog then
        # covers what a test clicks or hovers. Mark it seen on the instance instead.
        request = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": "mutation { setNuxSeen }"}).encode(),
                                         headers={"Content-Type": "application/json"})
        assert json.load(urllib.request.urlopen(request, timeout=30)) == {"data": {"setNuxSeen": True}}
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _hover_until(page, target, shown, attempts: int = 3, timeout_ms: int = 10_000) -> None:
    """Hover ``target`` until ``shown`` is visible: the popover opens on a mouse-enter
    that a page still settling can miss, so the mouse leaves (Escape closes any popover
    left open over the target) and enters again, up to ``attempts`` times; the last
    failure is raised."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    for attempt in range(attempts):
        try:
            target.hover(timeout=timeout_ms)
            expect(shown).to_be_visible(timeout=timeout_ms)
            return
        except (AssertionError, PlaywrightError):
            if attempt == attempts - 1:
                raise
            page.mouse.move(0, 0)
            page.keyboard.press("Escape")


def test_a_new_code_version_shows_unsynced_until_rerun(bumped_webserver, fresh_tiny):
    from playwright.sync_api import expect, sync_playwright

    from megacpp_assets.cli import run_snapshot
    from tests.ui_bumped_defs import STAGES_BUMPED

    root, instance, _ = fresh_tiny
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    partition_page = f"{bumped_webserver}/assets/chunk_dedup?view=partitions&partition=tiny"
    with sync_playwright() as p:
        browser, page = _open_page(p)
        page.goto(partition_page, wait_until="networkidle")
        _dismiss_welcome(page)
        expect(page.get_by_text("Unsynced").first).to_be_visible()
        # the popover's own words: "Code version" alone also matches text hidden elsewhere
        _hover_until(page, page.get_by_text("Unsynced").first, page.get_by_text("has a new code version").first)
        page.screenshot(path=str(ARTIFACTS / "ui-unsynced.png"))
        # the asset that did not change is not unsynced
        page.goto(f"{bumped_webserver}/assets/source_files?view=partitions&partition=tiny%2Flz4-4.4.5", wait_until="networkidle")
        expect(page.get_by_text("Materialized").first).to_be_visible()
        expect(page.get_by_text("Unsynced")).to_have_count(0)
        # megacpp run re-materializes what changed; the UI shows it in sync again
        assert run_snapshot("tiny", str(root), instance=instance, stages=STAGES_BUMPED) == 0
        page.goto(partition_page, wait_until="networkidle")
        expect(page.get_by_text("Materialized").first).to_be_visible()
        expect(page.get_by_text("Unsynced")).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "ui-synced.png"))
        browser.close()


def test_revision_by_shard_grid_of_a_per_document_asset(bumped_webserver, fresh_tiny):
    """A per-document asset shows the revision × shard grid: a revision column, a shard
    column, every materialized cell, and one cell's figures (from its run)."""
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open_page(p)
        page.goto(f"{bumped_webserver}/assets/tokenized_documents?view=partitions", wait_until="networkidle")
        _dismiss_welcome(page)
        expect(page.get_by_placeholder("Filter by revision…")).to_be_visible()
        expect(page.get_by_placeholder("Filter by shard…")).to_be_visible()
        expect(page.get_by_text("Materialized (3)")).to_be_visible()  # tiny: three revisions of one shard each
        page.get_by_text(PARTITION, exact=True).first.click()
        page.get_by_text("000", exact=True).first.click()
        row = page.locator("tr", has=page.get_by_text("documents", exact=True)).first
        expect(row).to_contain_text("18")  # lz4 4.4.5's shard: 18 documents
        page.screenshot(path=str(ARTIFACTS / "ui-shard-grid.png"))
        browser.close()


def test_family_plots_are_images_in_the_asset_metadata(bumped_webserver, fresh_tiny):
    """The curriculum plots as the UI shows them: the ``plots`` metadata of the dataset
    card (document length, row fill, tokens per source and family) and of a family asset
    opens as markdown whose PNG images are loaded and visible."""
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open_page(p)
        for asset, alts in (("dataset_card", ["Document length per family", "Row fill per family",
                                              "Tokens per source and per family"]),
                            ("p4_structure_dataset", ["p4_structure_lengths_and_fill"])):
            page.goto(f"{bumped_webserver}/assets/{asset}?view=partitions&partition=tiny", wait_until="networkidle")
            _dismiss_welcome(page)
            row = page.locator("tr", has=page.get_by_text("plots", exact=True)).first
            row.get_by_text("[Show Markdown]").click()
            dialog = page.locator("[role=dialog]").first
            for alt in alts:
                img = dialog.get_by_role("img", name=alt)
                img.scroll_into_view_if_needed()
                expect(img).to_be_visible()
                assert img.evaluate("i => i.complete && i.naturalWidth > 300 && i.naturalHeight > 100"), (asset, alt)
                assert img.get_attribute("src").startswith("data:image/png;base64,")
            page.screenshot(path=str(ARTIFACTS / f"ui-plots-{asset}.png"))
            page.keyboard.press("Escape")
        browser.close()
    assert (ARTIFACTS / "ui-plots-dataset_card.png").stat().st_size > 10_000


def test_backfill_of_one_snapshot_materializes_its_shard_partitions(bumped_webserver, fresh_tiny):
    """A backfill launched from the UI on ``shard_job`` (the per-document assets) for the
    ``tiny`` revisions × every shard: the daemon runs it to completion and every revision ×
    shard partition of every per-document asset gets a materialization from that backfill."""
    from dagster import AssetKey, AssetRecordsFilter
    from dagster._core.execution.backfill import BulkActionStatus
    from playwright.sync_api import expect, sync_playwright

    _, instance, _ = fresh_tiny
    shard_assets = ["quality_files", "license_files", "scrubbed_files", "minhash_signatures", "chunked_documents",
                    "tokenized_documents", "phase1_phase2_documents"]
    keys = [f"{r}|{s}" for r in instance.get_dynamic_partitions("repo_revision") if r.startswith("tiny/")
            for s in instance.get_dynamic_partitions("shard")]
    assert len(keys) == 3  # tiny: three revisions of one shard each
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser, page = _open_page(p)
        page.goto(f"{bumped_webserver}/locations/tests.ui_bumped_defs:defs/jobs/shard_job", wait_until="networkidle")
        _dismiss_welcome(page)
        page.get_by_role("button", name="Materialize all").first.click()
        dialog = page.locator("[role=dialog]").first
        expect(dialog.get_by_text(f"Launch runs to materialize {len(shard_assets)} assets")).to_be_visible()
        # revisions of the one snapshot (the sensor registered every shipped manifest's), every shard
        dialog.get_by_text("Select a partition or create one").first.click()
        page.keyboard.type("tiny/")
        page.get_by_text("Select all (3)").click()
        page.keyboard.press("Escape")
        dialog.get_by_role("button", name="All").nth(1).click()
        expect(dialog.get_by_text("3 partitions", exact=True)).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "ui-backfill-dialog.png"))
        dialog.get_by_role("button", name="Launch backfill").click()
        toast = page.get_by_text("Created backfill").first
        toast.wait_for()
        backfill_id = toast.inner_text().split()[-1]

        deadline = time.monotonic() + 600
        while instance.get_backfill(backfill_id).status == BulkActionStatus.REQUESTED:
            assert time.monotonic() < deadline, "the backfill did not finish in 10 minutes"
            time.sleep(3)
        assert instance.get_backfill(backfill_id).status == BulkActionStatus.COMPLETED_SUCCESS
        page.goto(f"{bumped_webserver}/runs/b/{backfill_id}", wait_until="networkidle")
        expect(page.get_by_text("Succeeded", exact=True).first).to_be_visible()
        expect(page.get_by_text("100% completed")).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "ui-backfill.png"))
        browser.close()
    for name in shard_assets:
        for key in keys:
            recs = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey(name), asset_partitions=[key]),
                                                   limit=1).records
            assert recs, f"{name} {key}: never materialized"
            run = instance.get_run_by_id(recs[0].run_id)
            assert run.tags.get("dagster/backfill") == backfill_id, f"{name} {key}: last materialized outside the backfill"
