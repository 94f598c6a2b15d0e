"""The web console at /ui, in Debian's headless chromium driven by Playwright,
against a real 3-node cluster: what an operator sees and does.

Screenshots of each page land in results/console/ (RAFTQ_RESULTS_DIR
overrides results/). Under CI=true a missing chromium or Playwright fails
the test instead of skipping it: .ci/run installs both.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for_settled_leaders
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RESULTS = Path(os.environ.get("RAFTQ_RESULTS_DIR", Path(__file__).resolve().parent.parent / "results")) / "console"
WAIT_MS = 30_000


def browser_or_skip():
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "Playwright is not installed (pip install -e '.[dev]')"
    if problem is None and not (os.path.exists(CHROMIUM) and shutil.which(CHROMIUM)):
        problem = f"{CHROMIUM} is missing (apt-get install chromium)"
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the console test needs a browser in CI: {problem}")
        pytest.skip(problem)
    return sync_playwright


def cli(cluster, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTQ_URL", "RAFTQ_TOKEN")}
    env["RAFTQ_URL"] = ",".join(cluster.urls)
    if cluster.token:
        env["RAFTQ_TOKEN"] = cluster.token
    done = subprocess.run([sys.executable, "-m", "raftq", *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_console_shows_and_steers_the_cluster_through_a_failover(fresh_cluster):
    sync_playwright = browser_or_skip()
    RESULTS.mkdir(parents=True, exist_ok=True)
    cluster = fresh_cluster(3)
    first_leader = cluster.wait_for_leader(30)
    serving = next(n for n in cluster.ids if n != first_leader)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("dialog", lambda dialog: dialog.accept())
            script_errors = []
            page.on("pageerror", lambda error: script_errors.append(str(error)))
            page.on("console", lambda message: "Content Security Policy" in message.text
                    and script_errors.append(message.text))
            page.goto(cluster.url(serving) + "/ui")
            if cluster.token:
                page.fill("#token", cluster.token)
                page.click("#token-form button")

            # the cluster: every node, the leader marked, all healthy
            for nid in cluster.ids:
                page.wait_for_selector(f'#nodes tr[data-node="{nid}"]', timeout=WAIT_MS)
            page.wait_for_selector(f'#nodes tr[data-node="{first_leader}"] .badge.leader', timeout=WAIT_MS)
            page.wait_for_function("() => document.querySelectorAll('#nodes .badge.good').length === 3",
                                   timeout=WAIT_MS)
            page.evaluate("window.stillTheSamePage = true")

            # hand leadership to the node that serves the console
            page.click(f'#nodes tr[data-node="{serving}"] button[data-lead]')
            page.wait_for_selector(f'#nodes tr[data-node="{serving}"] .badge.leader', timeout=WAIT_MS)
            leader = serving
            assert cluster.wait_for_leader(30) == leader
            assert page.inner_text("#connection") == f"live · leader {leader}"

            # create a queue from the console
            page.click("#create-queue summary")
            page.fill("#create-form input[name=name]", "orders")
            page.fill("#create-form input[name=max_deliveries]", "1")
            page.fill("#create-form input[name=dead_letter]", "orders-dlq")
            page.click("#create-form button[type=submit]")
            page.wait_for_selector('#queues tr[data-queue="orders"]', timeout=WAIT_MS)
            with cluster.client() as client:
                config = client.queue("orders")["config"]
            assert (config["max_deliveries"], config["dead_letter"]) == (1, "orders-dlq")

            # put messages with the CLI and watch the depth change live
            depth = page.locator('#queues tr[data-queue="orders"] td.depth')
            assert depth.inner_text() == "0"
            for n in range(3):
                cli(cluster, "put", "orders", f'{{"order": {n}}}')
            page.wait_for_function(
                """() => document.querySelector('#queues tr[data-queue="orders"] td.depth')?.textContent === '3'""",
                timeout=WAIT_MS)
            page.screenshot(path=str(RESULTS / "overview.png"), full_page=True)

            # two orders die; the console shows them with their x-raftq-* headers and redrives them
            with cluster.client() as client:
                for message in client.receive("orders", max=2)["messages"]:
                    client.nack("orders", [message["receipt"]])
            page.evaluate("location.hash = '#/queue/orders-dlq'")
            page.wait_for_selector("#messages tr[data-seq]", timeout=WAIT_MS)
            page.wait_for_function("() => document.querySelectorAll('#messages tr[data-seq]').length === 2",
                                   timeout=WAIT_MS)
            headers = page.inner_text("#messages")
            assert "x-raftq-from-queue: orders" in headers and "x-raftq-reason: max_deliveries" in headers
            assert page.is_visible("#redrive-form")
            page.screenshot(path=str(RESULTS / "dead-letters.png"), full_page=True)
            page.click("#redrive-form button[type=submit]")
            page.wait_for_function("() => document.querySelector('#toast')?.textContent.includes('moved 2 to orders')",
                                   timeout=WAIT_MS)
            page.wait_for_function(
                """() => document.querySelector('[data-stat="depth"]')?.textContent === '0'""", timeout=WAIT_MS)
            with cluster.client() as client:
                assert client.queue("orders")["stats"]["depth"] == 3
                assert client.queue("orders-dlq")["stats"]["redriven_total"] == 2

            page.evaluate("location.hash = '#/queue/orders'")
            page.wait_for_function("() => document.querySelectorAll('#messages tr[data-seq]').length === 3",
                                   timeout=WAIT_MS)
            assert page.input_value("#patch-form input[name=max_deliveries]") == "1"
            assert page.locator('#groups tr[data-group="default"]').count() == 1

            # patch the config, add and delete a group
            page.fill("#patch-form input[name=lease_ms]", "5000")
            page.fill("#patch-form input[name=max_deliveries]", "")
            page.click("#patch-form button[type=submit]")
            page.wait_for_function("() => document.querySelector('#toast')?.textContent === 'patch queue orders — done'",
                                   timeout=WAIT_MS)
            with cluster.client() as client:
                config = client.queue("orders")["config"]
            assert (config["lease_ms"], config["max_deliveries"], config["dead_letter"]) == (5000, None, "orders-dlq")
            page.fill("#group-form input[name=group]", "audit")
            page.click("#group-form button[type=submit]")
            page.wait_for_selector('#groups tr[data-group="audit"]', timeout=WAIT_MS)
            assert page.inner_text('#groups tr[data-group="audit"]').split()[:4] == ["audit", "3", "0", "3"]
            page.screenshot(path=str(RESULTS / "queue.png"), full_page=True)
            page.click('#groups tr[data-group="audit"] button[data-delete-group]')
            page.wait_for_selector('#groups tr[data-group="audit"]', state="detached", timeout=WAIT_MS)
            with cluster.client() as client:
                assert [g["name"] for g in client.groups("orders")["groups"]] == ["default"]

            # delete a queue
            with cluster.client() as client:
                client.create_queue("scratch")
            page.evaluate("location.hash = '#/queue/scratch'")
            page.wait_for_selector('[data-stat="depth"]', timeout=WAIT_MS)
            page.click("#delete-queue")
            page.wait_for_function("() => location.hash === '#/'", timeout=WAIT_MS)
            page.wait_for_selector('#queues tr[data-queue="scratch"]', state="detached", timeout=WAIT_MS)
            with cluster.client() as client:
                assert "scratch" not in [q["name"] for q in client.queues()["queues"]]
            assert page.evaluate("window.stillTheSamePage") is True   # all of it live, no reload

            # kill the leader, which served the console: it moves to a live node and
            # shows the new leader and the dead node
            cluster.kill(leader)
            new_leader = cluster.wait_for_leader(30, among=[n for n in cluster.ids if n != leader])
            assert new_leader is not None
            page.wait_for_selector(f'#nodes tr[data-node="{new_leader}"] .badge.leader', timeout=WAIT_MS)
            page.wait_for_selector(f'#nodes tr.down[data-node="{leader}"]', timeout=WAIT_MS)
            assert "DOWN" in page.inner_text(f'#nodes tr[data-node="{leader}"]')
            assert page.inner_text("#connection") == f"live · leader {new_leader}"
            assert f"Node {leader} stopped answering" in page.inner_text("#banner")
            assert page.locator("#elections li").count() >= 1
            page.screenshot(path=str(RESULTS / "failover.png"), full_page=True)
            assert script_errors == []
        finally:
            browser.close()


def test_console_says_which_token_it_needs_and_when_one_was_rejected(fresh_cluster):
    sync_playwright = browser_or_skip()
    cluster = fresh_cluster(1)
    assert cluster.wait_for_leader(30) == "n1"

    def connection_says(page, *words):
        page.wait_for_function(
            "words => words.every(w => document.querySelector('#connection').textContent.includes(w))",
            arg=list(words), timeout=WAIT_MS)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(cluster.url("n1") + "/ui")
            connection_says(page, "the metrics action", "is needed")
            for token, words in (("not-a-token", ("was rejected", "the metrics action")),
                                 (cluster.cfg.tokens.data, ("may not see the cluster", "the metrics action")),
                                 (cluster.token, ("live · leader n1",))):
                page.fill("#token", token)
                page.click("#token-form button")
                connection_says(page, *words)
        finally:
            browser.close()


def test_with_four_groups_the_console_shows_the_groups_their_leaders_and_the_catalogs_fill(fresh_cluster):
    sync_playwright = browser_or_skip()
    cluster = fresh_cluster(3, groups=4, node_args=("--max-queues", "5"))
    wait_for_settled_leaders(cluster)
    url = cluster.url(cluster.ids[0])
    for name in ("one", "two", "three"):
        assert call("PUT", f"{url}/v1/queues/{name}", {}).status == 201

    def summary_says(page, *words):
        page.wait_for_function(
            "words => words.every(w => document.querySelector('#cluster-summary').textContent.includes(w))",
            arg=list(words), timeout=WAIT_MS)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/ui")
            page.fill("#token", cluster.token)
            page.click("#token-form button")
            summary_says(page, "4 Raft groups, led: n1 ", "catalog: 3 of 20 queue names")
            assert call("DELETE", f"{url}/v1/queues/two").status == 204   # its name leaves the catalog
            summary_says(page, "catalog: 2 of 20 queue names")
            RESULTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(RESULTS / "groups.png"))
        finally:
            browser.close()


def test_the_principals_page_makes_a_principal_shows_its_token_once_and_revokes_it(fresh_cluster):
    """An operator makes a principal with a rule and a quota on the console's principals page, is
    shown its token once (which the cluster then takes), sees the change among the credential
    changes, and revokes it: every node refuses the token."""
    sync_playwright = browser_or_skip()
    RESULTS.mkdir(parents=True, exist_ok=True)
    cluster = fresh_cluster(1)
    url = cluster.url(cluster.wait_for_leader(30))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("dialog", lambda dialog: dialog.accept())
            page.goto(url + "/ui")
            page.fill("#token", cluster.token)
            page.click("#token-form button")
            page.goto(url + "/ui#/principals")
            page.click("#create-principal summary")
            page.fill("#principal-form [name=name]", "console-writer")
            page.fill("#principal-form [name=rules]", "put,browse:shop-*")
            page.fill("#principal-form [name=quota-queues]", "5")
            page.click("#principal-form button")
            page.wait_for_selector("#new-credentials:not([hidden])", timeout=WAIT_MS)
            shown = page.text_content("#new-credentials-text")
            token = shown.split("export RAFTQ_TOKEN=", 1)[1].split()[0]
            me = call("GET", url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"})
            assert (me.status, me.body["name"], me.body["quotas"]) == (200, "console-writer", {"queues": 5}), me
            row = page.wait_for_selector("tr[data-principal=console-writer]", timeout=WAIT_MS)
            assert "put,browse:shop-*" in row.text_content() and token not in row.text_content()
            page.wait_for_function("() => document.querySelector('#audit').textContent.includes('console-writer')",
                                   timeout=WAIT_MS)
            page.screenshot(path=str(RESULTS / "principals.png"), full_page=True)
            page.click("button[data-revoke=console-writer]")
            page.wait_for_function("() => !document.querySelector('tr[data-principal=console-writer]')",
                                   timeout=WAIT_MS)
            wait_until(lambda: call("GET", url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status
                       == 401, 10, "the node to refuse the revoked token")
        finally:
            browser.close()
