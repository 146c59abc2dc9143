"""Real-browser smoke test: JupyterLab in headless Chromium, every notebook, one widget each.

nbval runs every cell and compares text outputs, but it never renders a plot or a widget. This
test does what a learner does: starts JupyterLab on loopback, opens each notebook in Debian's
Chromium (driven by Playwright; no browser is downloaded), runs the first widget's cell and the
cells it needs (``cell_slice``: the cells binding the names it reads, not the measurements above
it), moves that widget, and asserts that what the widget shows changes and that no cell shows an
error. To stay within about two minutes on two cores, the JupyterLab page loads once and all
notebooks share one kernel (torch and the warm server start once); the served copies hold no
stored outputs, so whatever shows ran in this session. Screenshots
land in ``test-output/screenshots/`` (CI keeps that folder as an artifact).

Needs ``/usr/bin/chromium`` and the ``playwright`` package; without them the test is skipped —
unless ``COURSE_REQUIRE_BROWSER=1`` (set by ``.ci/run``), which turns a missing browser into a
failure.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cell_slice import cells_needed

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WIDGET_SOURCE = ("interact(", "_widget(", "widget()", "widgets.interact")
PANEL = ".jp-NotebookPanel:visible"  # the notebook on screen (earlier ones stay open, hidden)

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
    # render every cell (no virtual scrolling), so the test can find cells anywhere; start the
    # kernel without asking (a late "Select Kernel" dialog would swallow the key presses)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps(
        {"windowingMode": "none", "autoStartDefaultKernel": True}))
    # serve a copy: a browser session autosaves, and the repo's notebooks must stay as committed
    served = tmp_path_factory.mktemp("lab-root")
    shutil.copytree(ROOT / "notebooks", served / "notebooks")
    for path in (served / "notebooks").glob("*.ipynb"):  # no stored outputs or prompt numbers:
        notebook = json.loads(path.read_text())        # what shows ran in this session
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        path.write_text(json.dumps(notebook))
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path_factory.mktemp("lab-log") / "server.log"  # read on failure; a pipe nobody
    server_log = log.open("wb")                             # drained would block the server
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path_factory.mktemp("lab-workspaces"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0", "--allow-root",
         f"--ServerApp.root_dir={served}", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=server_log, start_new_session=True)
    server_log.close()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text(errors="replace")[-2000:])
            time.sleep(0.5)
    else:
        raise RuntimeError("JupyterLab did not start")
    _share_one_kernel(base, token)
    yield base, token, served / "notebooks", log
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def _api(base: str, token: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"token {token}",
                                              "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _share_one_kernel(base: str, token: str) -> None:
    """One kernel for all notebooks: torch, course_lib and the warm server load once, not 8 times.

    Each notebook gets a session bound to that kernel before the browser opens it, so
    JupyterLab connects to it instead of starting (and asking about) a new one.
    """
    kernel = _api(base, token, "/api/kernels", {"name": "python3"})
    for name in NOTEBOOKS:
        _api(base, token, "/api/sessions", {"path": f"notebooks/{name}", "type": "notebook",
                                             "name": name, "kernel": {"id": kernel["id"]}})


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def page(lab, browser):
    """One JupyterLab page for all notebooks: the app loads once; each test opens a notebook."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    yield page
    page.close()


def _open(page, base: str, token: str, name: str) -> None:
    """Open ``name``: the first through its URL, the next ones from the file browser."""
    if page.url.startswith(base):
        page.locator(".jp-DirListing-itemText", has_text=name).first.dblclick()
    else:
        page.goto(f"{base}/lab/tree/notebooks/{name}?token={token}&reset", timeout=120_000)
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text=name[:12]).first.wait_for(timeout=120_000)


def _widget_cell(path: Path) -> tuple[int, list[int]]:
    """The first widget cell and the cells it needs, in notebook order."""
    cells = json.loads(path.read_text())["cells"]
    sources = ["".join(c["source"]) if c["cell_type"] == "code" else "" for c in cells]
    for i, source in enumerate(sources):
        if any(k in source for k in WIDGET_SOURCE):
            return i, cells_needed(sources, i)
    raise AssertionError(f"{path.name} has no widget cell")


def _wait_idle(page, timeout_s: float) -> None:
    """Until no cell shows the busy prompt [*] and the kernel says idle."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = page.locator(f"{PANEL} .jp-InputPrompt", has_text="[*]").count()
        indicator = page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator")
        status = indicator.first.get_attribute("data-status") if indicator.count() else "idle"
        if busy == 0 and status in (None, "idle"):
            return
        time.sleep(0.5)
    raise AssertionError("cells still running after the time limit")


def _dismiss_kernel_dialog(page) -> None:
    select_kernel = page.get_by_role("button", name="Select", exact=True)
    if select_kernel.count():
        select_kernel.first.click()


def _run_cell(page, cell) -> None:
    """Select ``cell``, press Ctrl+Enter, and see it queued or run (its prompt was empty)."""
    prompt = cell.locator(".jp-InputPrompt").first
    for _ in range(3):
        _dismiss_kernel_dialog(page)
        cell.locator(".jp-InputArea-prompt").first.click()
        page.keyboard.press("Control+Enter")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if re.fullmatch(r"\[(\*|\d+)\]:", prompt.inner_text().strip()):
                return
            time.sleep(0.2)
    raise AssertionError(f"cell did not start: its prompt shows {prompt.inner_text()!r}")


def _view_of(output) -> str:
    """What the widget shows: its output area's text (without progress lines) and image data."""
    text = output.evaluate("e => { const c = e.cloneNode(true);"
                           " c.querySelectorAll('.course-progress').forEach(p => p.remove());"
                           " document.body.appendChild(c); const t = c.innerText; c.remove();"
                           " return t; }")
    images = output.locator("img").evaluate_all("els => els.map(e => e.src.slice(-200))")
    return text + "|" + "|".join(images)


def _errors(page):
    """The error outputs (tracebacks) in the notebook on screen."""
    return page.locator(f'{PANEL} .jp-OutputArea-output[data-mime-type="application/vnd.jupyter'
                        f'.error"], {PANEL} .jp-RenderedText[data-mime-type="application/vnd.'
                        'jupyter.error"]')


def _page_report(page, indices: list[int], log: Path) -> str:
    """What the notebook on screen shows: the kernel's status, any dialog, and each cell's prompt
    and output text (an error's traceback included), for the cells the test ran; then the last
    lines of the server's log (a kernel that died and restarted says so there)."""
    try:
        cells = page.locator(f"{PANEL} .jp-Cell")
        indicator = page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator")
        lines = [f"kernel status: {indicator.first.get_attribute('data-status') if indicator.count() else None}"]
        for dialog in page.locator(".jp-Dialog").all():
            lines.append(f"dialog: {dialog.inner_text()[:500]!r}")
        for i in indices:
            cell = cells.nth(i)
            prompt = cell.locator(".jp-InputPrompt").first.inner_text().strip()
            output = cell.locator(".jp-OutputArea").first
            text = output.inner_text()[-3000:] if output.count() else "(no output area)"
            lines.append(f"cell {i} {prompt} output: {text!r}")
        tail = log.read_text(errors="replace").splitlines()[-25:]
        return "\n".join(lines + ["server log, last lines:"] + tail)
    except Exception as err:  # pragma: no cover - the report must never hide the failure
        return f"(no page report: {err!r})"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_open_notebook_run_to_the_widget_and_move_it(lab, page, name):
    base, token, served, log = lab
    index, needed = _widget_cell(served / name)  # the served copy: the repo may change meanwhile
    start, phases = time.monotonic(), []

    def phase(what: str) -> None:
        phases.append(f"{what} {time.monotonic() - start:.1f}s")
    try:
        _open(page, base, token, name)
        cells = page.locator(f"{PANEL} .jp-Cell")
        cells.first.wait_for(timeout=120_000)
        _dismiss_kernel_dialog(page)  # a fresh server may ask once
        news = page.get_by_role("button", name="No", exact=True)
        if news.count():  # "Would you like to get notified about official Jupyter news?"
            news.first.click()
        page.locator(f"{PANEL} .jp-Notebook-ExecutionIndicator").first.wait_for(timeout=60_000)
        phase("opened")
        _wait_idle(page, 120)  # the kernel is connected: no key press gets lost
        phase("kernel idle")
        # run the cells the widget cell needs, then the widget cell, each queued in the kernel
        target = cells.nth(index)
        for i in needed + [index]:
            _run_cell(page, cells.nth(i))
        time.sleep(1)
        _wait_idle(page, 240)
        phase(f"{len(needed) + 1} cells run")
        assert _errors(page).count() == 0, f"{name}: a cell shows an error (its traceback is in the captured output)"
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
        phase("widget changed")
        page.screenshot(path=str(SHOTS / f"{name[:-6]}-after.png"))
        assert after != before, f"{name}: moving the widget changed nothing on screen"
        errors = _errors(page)
        assert errors.count() == 0, f"{name}: a cell shows an error: {errors.first.inner_text()[:500]}"
        prompt = target.locator(".jp-InputPrompt").first.inner_text()
        assert re.fullmatch(r"\[\d+\]:", prompt.strip()), f"{name}: the widget cell did not run"
    except Exception:  # say what the page showed: a CI failure is read from its log alone
        print(_page_report(page, needed + [index], log))
        raise
    finally:
        print(f"{name}: " + ", ".join(phases))  # where the seconds go (shown with -s or -rA)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name[:-6]}-last.png"), full_page=False)
