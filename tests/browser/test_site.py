"""The web edition read as a reader reads it: headless Chromium over a local HTTP server.

``.ci/build-site`` renders the stored notebooks into ``_build/site/``. This test serves that
folder on 127.0.0.1 and opens the home page, every chapter, the glossary and the architecture
notes; it checks that no internal link or anchor is broken, that every figure loads and each
chapter shows as many as its notebook stores, that no widget shows its raw ``interactive(...)``
repr, that the launch links open the right notebook (the Binder URL taken from the README's
badge here, independently of the build), that the sidebar follows the course order, that the
search finds "ZeRO", and that no page asks the internet for anything (every request that does
not go to the local server is blocked and reported).

Skipped when the site is not built or the browser is missing, unless ``COURSE_REQUIRE_SITE=1``
or ``COURSE_REQUIRE_BROWSER=1`` (both set by ``.ci/run``), which make either a failure.
"""
from __future__ import annotations

import functools
import html
import json
import os
import re
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "site"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PAGES = ["index.html", *(f"notebooks/{n[:-6]}.html" for n in NOTEBOOKS),
         "docs/glossary.html", "docs/architecture.html", "docs/contributing.html"]
RAW_WIDGET = re.compile(r"\b(interactive|VBox|HBox)\(children=")

if not (SITE / "index.html").exists():
    if os.environ.get("COURSE_REQUIRE_SITE") == "1":
        raise RuntimeError("_build/site/index.html is missing: run .ci/build-site first")
    pytest.skip("the web edition is not built (.ci/build-site)", allow_module_level=True)
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - reported by the skip below
    sync_playwright = None
if sync_playwright is None or not os.path.exists(CHROMIUM):
    if os.environ.get("COURSE_REQUIRE_BROWSER") == "1":
        raise RuntimeError("the site test needs playwright and /usr/bin/chromium")
    pytest.skip("playwright or chromium missing", allow_module_level=True)


def _binder_base() -> str:
    """https://mybinder.org/v2/gh/OWNER/REPO/REF, read from the README's Binder link."""
    match = re.search(r"(https://mybinder\.org/v2/gh/[^)?\s]+)\?urlpath=", (ROOT / "README.md").read_text())
    assert match, "README.md has no Binder link"
    return match.group(1)


def _stored_images(name: str) -> int:
    """image/png outputs the notebook stores: in its cells and in its widgets' Output state."""
    notebook = json.loads((ROOT / "notebooks" / name).read_text())
    count = sum("image/png" in out.get("data", {})
                for cell in notebook["cells"] for out in cell.get("outputs", []))
    state = notebook["metadata"].get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return count + sum("image/png" in out.get("data", {}) for model in state.values()
                       if model.get("model_name") == "OutputModel"
                       for out in model.get("state", {}).get("outputs", []))


def _widget_outputs(name: str) -> int:
    notebook = json.loads((ROOT / "notebooks" / name).read_text())
    return sum("application/vnd.jupyter.widget-view+json" in out.get("data", {})
               for cell in notebook["cells"] for out in cell.get("outputs", []))


@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> set[str]:
    return {html.unescape(i) for i in re.findall(r'\b(?:id|name)="([^"]+)"', path.read_text())}


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no access log in the test output
        pass


@pytest.fixture(scope="module")
def base():
    """_build/site served on 127.0.0.1 at a free port, in a thread of this process."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser_page(base):
    """One page whose every request off the local server is blocked and recorded."""
    outside: list[str] = []

    def route(r):
        if r.request.url.startswith(base) or r.request.url.startswith("data:"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        page.route("**/*", route)
        yield page, outside
        chromium.close()


def _open(browser_page, base: str, path: str):
    page, outside = browser_page
    outside.clear()
    response = page.goto(base + path, wait_until="load")
    assert response is not None and response.ok, f"{path}: HTTP {response and response.status}"
    return page, outside


@pytest.mark.parametrize("path", PAGES)
def test_page_links_figures_and_no_internet(base, browser_page, path):
    page, outside = _open(browser_page, base, path)
    hrefs = page.locator("a[href]").evaluate_all("els => els.map(e => e.href)")
    broken = []
    for href in hrefs:
        if not href.startswith(base):
            continue
        parts = urlsplit(href)
        target = SITE / unquote(parts.path[len(urlsplit(base).path):])
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(href)
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _ids(target):
            broken.append(href)
    assert not broken, f"{path}: broken internal links: {sorted(set(broken))}"
    images = page.locator("article img").evaluate_all(
        "els => els.map(e => [e.getAttribute('src').slice(0, 80), e.complete && e.naturalWidth > 0])")
    assert all(ok for _, ok in images), f"{path}: images that did not load: {images}"
    if path.startswith("notebooks/"):
        name = Path(path).stem + ".ipynb"
        assert len(images) == _stored_images(name), \
            f"{path}: {len(images)} figures on the page, the notebook stores {_stored_images(name)}" \
            " (a stale build? run .ci/build-site)"
    text = page.locator("body").inner_text()
    assert not RAW_WIDGET.search(text), f"{path}: a widget shows its raw repr"
    assert page.locator("article h1").count() == 1, f"{path}: one title per page"
    assert not outside, f"{path}: the page asked the internet for {outside}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_chapter_launch_links_widgets_and_toc(base, browser_page, name):
    page, _ = _open(browser_page, base, f"notebooks/{name[:-6]}.html")
    binder = page.locator("article .course-launch-binder")
    assert binder.count() == 1, f"{name}: one 'Open in Binder' link under the title"
    assert binder.inner_text().strip() == "Open in Binder"
    assert binder.get_attribute("href") == f"{_binder_base()}?urlpath=lab/tree/notebooks/{name}"
    command = page.locator("article .course-launch-lab code").inner_text().strip()
    assert command == f"jupyter lab notebooks/{name}"
    panels = page.locator("article .course-widget")
    assert panels.count() == _widget_outputs(name), f"{name}: one static panel per stored widget"
    for i in range(panels.count()):
        assert "run it in JupyterLab or Binder" in panels.nth(i).inner_text()
    assert page.locator("article h2 a.headerlink").count() >= 2, f"{name}: sections need anchors"
    assert page.locator(".toc-tree a").count() >= 2, f"{name}: no table of contents on the page"


def test_sidebar_follows_the_course_order(base, browser_page):
    page, _ = _open(browser_page, base, "index.html")
    hrefs = page.locator(".sidebar-tree a.reference").evaluate_all(
        "els => els.map(e => new URL(e.href).pathname.split('/').slice(-2).join('/'))")
    expected = [f"notebooks/{n[:-6]}.html" for n in NOTEBOOKS] + ["docs/glossary.html",
                                                                 "docs/architecture.html",
                                                                 "docs/contributing.html"]
    assert hrefs == expected
    chapters = page.locator("article table a").evaluate_all("els => els.map(e => e.href)")
    assert [urlsplit(h).path.split("/")[-1] for h in chapters[:len(NOTEBOOKS)]] == \
        [f"{n[:-6]}.html" for n in NOTEBOOKS], "the home page's chapter table links the pages"


def test_search_finds_zero(base, browser_page):
    page, outside = _open(browser_page, base, "search.html?q=ZeRO")
    results = page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=60_000)
    found = results.locator("a").evaluate_all("els => els.map(e => e.href)")
    assert any("03_sharding_zero_fsdp.html" in h for h in found), found
    assert any("08_deepspeed_and_megatron.html" in h for h in found), found
    assert not outside, f"search asked the internet for {outside}"


def test_copied_flags_keep_their_hyphens_and_wide_blocks_fit_the_column(base, browser_page):
    """Typography must not turn `--flag` into an en dash; a wide table scrolls inside itself instead
    of being cut off; at this width most code and output blocks fit the text column."""
    page, _ = _open(browser_page, base, "notebooks/03_sharding_zero_fsdp.html")
    text = page.locator("article").text_content()  # folded text too: the flag sits in a <details>
    assert "--use-distributed-optimizer" in text and "\u2013use-distributed-optimizer" not in text
    cut = page.locator("article table").evaluate_all(
        "els => els.filter(e => e.scrollWidth > e.clientWidth + 1"
        " && getComputedStyle(e).overflowX === 'visible').length")
    assert cut == 0, f"{cut} tables are cut off at the column's edge"
    wide = page.locator("article pre").evaluate_all(
        "els => els.map(e => e.scrollWidth > e.clientWidth + 1)")
    assert sum(wide) <= len(wide) // 4, f"{sum(wide)} of {len(wide)} code/output blocks scroll sideways"
