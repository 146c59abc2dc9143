"""Real-browser smoke test: JupyterLab in headless Chromium, every notebook, one widget each.

nbval runs every cell and compares text outputs, but it never renders a plot or a widget. This
test does what a learner does: starts JupyterLab on loopback, opens each notebook in Debian's
Chromium (driven by Playwright; no browser is downloaded), runs the cells up to and including
the first widget, moves that widget, and asserts that what the widget shows changes and that no
cell shows an error. Screenshots
land in ``test-output/screenshots/`` (CI keeps that folder as an artifact).

Needs ``/usr/bin/chromium`` and the ``playwright`` package; without them the test is skipped —
unless ``COURSE_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which turns a missing browser into a
failure.
"""
from __future__ import annotations

import json
import re
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WIDGET_SOURCE = ("interact(", "_widget(", "widget()", "widgets.interact")

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - reported by the skip below
    sync_playwright = None

if sync_playwright is None or not os.path.exists(CHROMIUM):
    if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
        raise RuntimeError("the browser test needs playwright and /usr/bin/chromium")
    pytest.skip("playwright or chromium missing (apt-get install chromium; pip install playwright)",
                allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a random port and token; stopped afterwards."""
    settings = tmp_path_factory.mktemp("lab-settings")
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    # render every cell (no virtual scrolling), so the test can find cells anywhere
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    # serve a copy: a browser session autosaves, and the repo's notebooks must stay as committed
    served = tmp_path_factory.mktemp("lab-root")
    shutil.copytree(ROOT / "notebooks", served / "notebooks")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path_factory.mktemp("lab-workspaces"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0", "--allow-root",
         f"--ServerApp.root_dir={served}", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()[-2000:])
            time.sleep(0.5)
    else:
        raise RuntimeError("JupyterLab did not start")
    yield base, token
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"])
        yield chromium
        chromium.close()


def _widget_cell(name: str) -> int:
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and any(k in "".join(cell["source"]) for k in WIDGET_SOURCE):
            return i
    raise AssertionError(f"{name} has no widget cell")


def _wait_idle(page, timeout_s: float) -> None:
    """Until no cell shows the busy prompt [*] and the kernel says idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = page.locator(".jp-InputPrompt", has_text="[*]").count()
        status = page.locator(".jp-Notebook-ExecutionIndicator").first.get_attribute("data-status") \
            if page.locator(".jp-Notebook-ExecutionIndicator").count() else "idle"
        if busy == 0 and status in (None, "idle"):
            return
        time.sleep(0.5)
    raise AssertionError("cells still running after the time limit")


def _view_of(output) -> str:
    """What the widget shows: its output area's text and any image data."""
    text = output.inner_text()
    images = output.locator("img").evaluate_all("els => els.map(e => e.src.slice(-200))")
    return text + "|" + "|".join(images)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_open_notebook_run_to_the_widget_and_move_it(lab, browser, name):
    base, token = lab
    index = _widget_cell(name)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(f"{base}/lab/tree/notebooks/{name}?token={token}&reset", timeout=120_000)
        cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
        cells.first.wait_for(timeout=120_000)
        select_kernel = page.get_by_role("button", name="Select", exact=True)
        if select_kernel.count():  # a fresh server may ask once
            select_kernel.first.click()
        news = page.get_by_role("button", name="No", exact=True)
        if news.count():  # "Would you like to get notified about official Jupyter news?"
            news.first.click()
        page.wait_for_function("document.querySelectorAll('.jp-Notebook-ExecutionIndicator,"
                               " .jp-Toolbar-kernelStatus').length > 0", timeout=60_000)
        # run every cell up to and including the widget cell
        target = cells.nth(index)
        target.locator(".jp-InputArea-prompt").first.click()
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Above Selected Cell").click()
        time.sleep(1)
        _wait_idle(page, 240)
        target.locator(".jp-InputArea-prompt").first.click()
        page.keyboard.press("Control+Enter")
        time.sleep(1)
        _wait_idle(page, 240)
        widget = target.locator(".jupyter-widgets").first
        widget.wait_for(timeout=60_000)
        before = _view_of(target.locator(".jp-OutputArea").first)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name[:-6]}-before.png"))
        slider = target.locator(".noUi-handle, .slider-container .ui-slider-handle")
        dropdown = target.locator(".jupyter-widgets select")
        if dropdown.count():
            select = dropdown.first
            options = select.locator("option").all_inner_texts()
            current = select.evaluate("e => e.options[e.selectedIndex].text")
            select.select_option(label=next(o for o in options if o != current))
        else:
            assert slider.count(), f"{name}: no slider or dropdown in the widget cell"
            slider.first.focus()
            page.keyboard.press("ArrowLeft")
        run_button = target.locator(".jupyter-widgets button")
        if run_button.count():  # a manual widget ("Run", "Plan"): a change takes effect on click
            run_button.first.click()
        deadline = time.monotonic() + 120
        after = before
        while after == before and time.monotonic() < deadline:
            time.sleep(0.5)
            after = _view_of(target.locator(".jp-OutputArea").first)
        _wait_idle(page, 120)
        page.screenshot(path=str(SHOTS / f"{name[:-6]}-after.png"))
        assert after != before, f"{name}: moving the widget changed nothing on screen"
        errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"],'
                              ' .jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]')
        assert errors.count() == 0, f"{name}: a cell shows an error: {errors.first.inner_text()[:500]}"
        prompt = target.locator(".jp-InputPrompt").first.inner_text()
        assert re.fullmatch(r"\[\d+\]:", prompt.strip()), f"{name}: the widget cell did not run"
    finally:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name[:-6]}-last.png"), full_page=False)
        page.close()
