"""The panel in a real browser: JupyterLab on loopback, Debian's Chromium driven headless by
Playwright, a notebook that shows the panel and runs a scenario; asserts that the timeline traces,
the cache table rows and the event rows are rendered; screenshot in tests/artifacts/ (not committed)."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ART = Path(__file__).parents[1] / "artifacts"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                                reason="Debian's chromium is not installed (.ci/run installs it)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(Path(__file__).with_name("browser_panel.nb.json"), root / "panel.ipynb")
    port, token = _port(), "slotlab-test"
    env = dict(os.environ, JUPYTERLAB_WORKSPACES_DIR=str(root / "ws"), JUPYTERLAB_SETTINGS_DIR=str(root / "settings"))
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                             "--allow-root", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
                            stdout=subprocess.DEVNULL, stderr=open(root / "lab.log", "w"), env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("JupyterLab did not start: " + (root / "lab.log").read_text()[-2000:])
    yield url, token
    proc.terminate()
    proc.wait(20)


def test_panel_renders_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    url, token = lab
    ART.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.goto(f"{url}/lab/tree/panel.ipynb?token={token}", timeout=60_000)
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=60_000)
        for attempt in range(3):  # the first click can land before the kernel session is wired up
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            try:
                page.wait_for_selector(".jp-InputPrompt:has-text('[1]')", timeout=20_000)
                break
            except Exception:
                page.keyboard.press("Escape")
        try:
            page.wait_for_selector("text=DONE 4", timeout=180_000)
        except Exception:
            page.screenshot(path=str(ART / "panel-failed.png"), full_page=True)
            raise
        page.wait_for_selector(".slotlab-panel .js-plotly-plot", timeout=60_000)
        time.sleep(1.5)  # the plot's last redraw
        n_bars = page.locator(".slotlab-panel .js-plotly-plot .barlayer .trace").count()
        n_points = page.locator(".slotlab-panel .js-plotly-plot .barlayer .point").count()
        page.screenshot(path=str(ART / "panel.png"), full_page=True)
        assert n_bars >= 2 and n_points >= 2, (n_bars, n_points)  # prefill + generated of the last request
        cache_rows = page.locator("table.slotlab-cache tr").count()
        assert cache_rows >= 2  # header + at least one entry
        page.locator(".slotlab-panel .lm-TabBar-tab", has_text="events").click()
        page.wait_for_selector("table.slotlab-events tr >> nth=3", timeout=10_000)
        assert page.locator("table.slotlab-events tr").count() > 5
        assert page.locator("table.slotlab-events", has_text="selected slot by LRU").count() == 1
        assert page.locator("table.slotlab-events", has_text="reusable tokens lost").count() == 1  # request_miss
        page.locator(".slotlab-panel .lm-TabBar-tab", has_text="why").click()
        page.wait_for_selector("ul.slotlab-why li >> nth=3", state="attached", timeout=10_000)
        missed = page.locator("ul.slotlab-why li", has_text="MISSED")
        assert missed.count() == 1 and "cache_prompt" in missed.first.inner_text()
        page.screenshot(path=str(ART / "panel-why.png"), full_page=True)
        browser.close()
