"""The web edition's sources (docs/site/stage.py) and, when built, its pages — without a browser.

stage.py runs on the repository as it is (standard library only, a second or so): every chapter
gets its launch bar with the README's Binder URL, no widget keeps its raw repr or its view mime
type, links to staged pages stay relative and other repository files go to GitHub. When
``_build/site`` exists, every chapter, the glossary and the architecture notes have a page whose
figures exist on disk (``COURSE_REQUIRE_SITE=1`` makes a missing build a failure).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "site"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
_spec = importlib.util.spec_from_file_location("site_stage", ROOT / "docs" / "site" / "stage.py")
stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage)

BINDER = "https://mybinder.org/v2/gh/o/r/HEAD"
GITHUB = "https://github.com/o/r/blob/HEAD"


def test_binder_base_and_github_come_from_the_readme_badge():
    readme = ("x\n[![Binder](https://mybinder.org/badge_logo.svg)]"
              "(https://mybinder.org/v2/gh/o/r/HEAD?urlpath=lab/tree/notebooks/00_a.ipynb)\n")
    assert stage.binder_base(readme) == BINDER
    assert stage.github_base(BINDER) == GITHUB
    plain = "## Teaching with Binder\n```\nhttps://mybinder.org/v2/gh/o/r/HEAD?urlpath=lab\n```\n"
    assert stage.binder_base(plain) == BINDER  # no badge: the README's plain Binder link
    with pytest.raises(SystemExit, match="no Binder link"):
        stage.binder_base("no badge here")


def test_links_to_pages_stay_others_go_to_github_code_untouched():
    pages = {"notebooks/01_b.ipynb", "docs/glossary.md"}
    text = ("[next](01_b.ipynb) [terms](../docs/glossary.md#zero) [code](../course_lib/run.py) "
            "[web](https://x.org/a) [top](#summary) `xs[0](y)`\n```\nfns[i](x)\n```\n")
    out = stage.fix_links(text, "notebooks", pages, GITHUB)
    assert "[next](01_b.ipynb)" in out and "[terms](../docs/glossary.md#zero)" in out
    assert f"[code]({GITHUB}/course_lib/run.py)" in out
    assert "[web](https://x.org/a)" in out and "[top](#summary)" in out
    assert "`xs[0](y)`" in out and "fns[i](x)" in out


def test_a_jupyterlab_anchor_to_a_page_becomes_the_sites_heading_slug():
    """JupyterLab names '## 3. Nothing lost' #3.-Nothing-lost; the site (MyST) names it
    #3-nothing-lost: a link between chapters must reach the heading in both."""
    pages = {"notebooks/06_f.ipynb", "README.md"}
    text = ("[home](06_f.ipynb#3.-Nothing-lost) [stuck](06_f.ipynb#A-stuck-rank-is-worse-than-a-dead-one) "
            "[trust](../README.md#trust-boundary)")
    out = stage.fix_links(text, "notebooks", pages, GITHUB)
    assert "[home](06_f.ipynb#3-nothing-lost)" in out
    assert "[stuck](06_f.ipynb#a-stuck-rank-is-worse-than-a-dead-one)" in out
    assert "[trust](../README.md#trust-boundary)" in out


def _widget_notebook() -> dict:
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_dd", "IPY_MODEL_out"]}},
        "dd": {"model_name": "DropdownModel", "state": {"description": "stage", "index": 1,
                                                         "_options_labels": ["0", "2"]}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "stream", "name": "stdout", "text": "peak <1 MiB>\n"},
            {"output_type": "display_data", "data": {"image/png": png, "text/plain": "<Figure>"}}]}},
    }
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    return {"metadata": {"widgets": {stage.WIDGET_STATE: {"state": state}}}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "← [prev](00_a.ipynb)\n\n# 01 · B\nText\n"},
        {"cell_type": "code", "metadata": {}, "source": "# NBVAL_IGNORE_OUTPUT\nwidget()", "outputs": [
            {"output_type": "execute_result", "data": {stage.WIDGET_VIEW: view,
                                                       "text/plain": "VBox(children=(Dropdown(...)))"}}]},
    ]}


def test_a_widget_becomes_a_static_panel_with_its_controls_and_stored_view():
    staged = stage.stage_notebook(_widget_notebook(), "01_b.ipynb", BINDER, set(), GITHUB)
    assert "widgets" not in staged["metadata"]  # no state: myst-nb adds no widget JavaScript
    title = staged["cells"][0]["source"]
    assert title.index("# 01 · B") < title.index("course-launch") < title.index("Text")
    assert f"{BINDER}?urlpath=lab/tree/notebooks/01_b.ipynb" in title
    assert "jupyter lab notebooks/01_b.ipynb" in title
    code = staged["cells"][1]
    assert code["source"] == "widget()"
    (panel,) = code["outputs"]
    body = panel["data"]["text/html"]
    assert list(panel["data"]) == ["text/html"] and "children=" not in body
    assert "run it in JupyterLab or" in body and "<code>stage = 2</code>" in body
    assert "peak &lt;1 MiB&gt;" in body and 'src="data:image/png;base64,iVBOR' in body


def test_a_notebook_without_a_title_is_refused():
    notebook = {"metadata": {}, "cells": [{"cell_type": "markdown", "metadata": {}, "source": "no title"}]}
    with pytest.raises(SystemExit, match="no '# ' title"):
        stage.stage_notebook(notebook, "01_b.ipynb", BINDER, set(), GITHUB)


def test_staging_the_repository(tmp_path):
    (tmp_path / "stale.md").write_text("old")
    files = stage.stage(tmp_path)
    assert not (tmp_path / "stale.md").exists()
    assert {p.relative_to(tmp_path).as_posix() for p in files} == {
        "index.md", "docs/glossary.md", "docs/architecture.md", "docs/contributing.md",
        *(f"notebooks/{p.name}" for p in NOTEBOOKS),
        *(image for image in stage.IMAGE.findall((ROOT / "README.md").read_text())
          if (ROOT / image).is_file())}  # the README's figures, copied as stored
    home = (tmp_path / "index.md").read_text()
    assert "badge_logo.svg" not in home  # an image from the internet would load at view time
    toctree = re.findall(r"^notebooks/\S+$", home, re.M)
    assert toctree == [f"notebooks/{p.stem}" for p in NOTEBOOKS]
    base = stage.binder_base((ROOT / "README.md").read_text())
    for path in NOTEBOOKS:
        text = (tmp_path / "notebooks" / path.name).read_text()
        assert stage.WIDGET_VIEW not in text and "interactive(children=" not in text
        assert f"{base}?urlpath=lab/tree/notebooks/{path.name}" in text


def _built() -> bool:
    if (SITE / "index.html").exists():
        return True
    if os.environ.get("COURSE_REQUIRE_SITE") == "1":
        pytest.fail("_build/site/index.html is missing: run .ci/build-site first")
    pytest.skip("the web edition is not built (.ci/build-site)")


@pytest.mark.parametrize("page", ["index", *(f"notebooks/{p.stem}" for p in NOTEBOOKS),
                                  "docs/glossary", "docs/architecture"])
def test_built_page_exists_and_its_figures_are_on_disk(page):
    _built()
    path = SITE / f"{page}.html"
    assert path.is_file(), f"no page {page}.html (a stale build? run .ci/build-site)"
    text = path.read_text()
    for src in re.findall(r'<img [^>]*src="([^"]+)"', text):
        if not src.startswith("data:"):
            assert (path.parent / src).resolve().is_file(), f"{page}: missing figure {src}"
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', text), \
        f"{page}: loads something from the internet"
    if page.startswith("notebooks/"):
        stored = json.loads((ROOT / f"{page}.ipynb").read_text())
        pngs = sum("image/png" in o.get("data", {}) for c in stored["cells"] for o in c.get("outputs", []))
        assert len(re.findall(r'<img [^>]*src="\.\./_images/', text)) == pngs, f"{page}: figures differ"
