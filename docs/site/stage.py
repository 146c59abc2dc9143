"""Lay out the web edition's Sphinx sources from the repository, as stored (nothing executes).

``python docs/site/stage.py OUT`` writes OUT/index.md (the README; a badge made a plain link; its figures copied),
OUT/notebooks/*.ipynb (copies with a launch bar under the title and every widget replaced by a
static panel) and OUT/docs/{glossary,architecture,contributing}.md. The layout mirrors the repository, so the
README's and the notebooks' relative links resolve to the pages as they are; a link to any other
file of the repository goes to that file on GitHub. A file is rewritten only when its text
changes, so Sphinx rebuilds only what changed. Standard library only: the site's venv needs no
course dependencies. Why a static panel: a widget needs a live kernel, and rendering its saved
state would load the widget JavaScript from a CDN; the panel names the controls and shows the
output the widget held when the notebook was stored.
"""
from __future__ import annotations

import base64
import html
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/glossary.md", "docs/architecture.md", "docs/contributing.md")
BADGE = re.compile(r"\[!\[[^\]]*\]\((https?://[^)]*badge[^)]*)\)\]\((https?://[^)]*/v2/gh/[^)?]*)\?[^)]*\)")
BINDER_URL = re.compile(r"(https://mybinder\.org/v2/gh/[^\s?)]+)\?")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CONTROL_KINDS = ("Slider", "Dropdown", "Text", "ToggleButtons", "Checkbox", "RadioButtons")


def binder_base(readme: str) -> str:
    """The Binder URL up to the query, from the README (its badge, else its first Binder link):
    the one place it is written."""
    match = BADGE.search(readme)
    if match:
        return match.group(2)
    match = BINDER_URL.search(readme)
    if not match:
        raise SystemExit("README.md has no Binder link https://mybinder.org/v2/gh/OWNER/REPO/REF?...")
    return match.group(1)


def github_base(binder: str) -> str:
    """https://github.com/OWNER/REPO/blob/REF from .../v2/gh/OWNER/REPO/REF."""
    owner, repo, ref = binder.split("/v2/gh/", 1)[1].split("/")[:3]
    return f"https://github.com/{owner}/{repo}/blob/{ref}"


def _slug(anchor: str) -> str:
    """A heading anchor as the site's MyST names it: JupyterLab's ``#3.-Nothing-lost`` (the
    heading with spaces made '-') becomes ``#3-nothing-lost``, MyST's slug of ``3. Nothing lost``
    (myst_parser's default slugify: lower case, only word characters, '-' and spaces, spaces
    made '-'); a GitHub-style anchor such as ``#trust-boundary`` stays as it is."""
    if not anchor:
        return anchor
    return "#" + re.sub(r"[^\w\u4e00-\u9fff\- ]", "", anchor[1:].strip().lower()).replace(" ", "-")


def fix_links(text: str, here: str, pages: set[str], github: str) -> str:
    """Relative links to staged pages stay (MyST resolves them); others go to the file on GitHub.

    ``here`` is the folder of the file holding ``text``, relative to the repository root.
    """
    def repl(match: re.Match) -> str:
        label, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return match.group(0)
        path = Path(here, target).as_posix()
        parts: list[str] = []
        for part in path.split("/"):
            if part == "..":
                if not parts:
                    return match.group(0)  # outside the repository: leave it to Sphinx's warning
                parts.pop()
            elif part not in (".", ""):
                parts.append(part)
        resolved = "/".join(parts)
        if resolved in pages:
            return f"[{label}]({target}{_slug(anchor)})"
        return f"[{label}]({github}/{resolved}{anchor})"
    # fenced code and inline code keep their text: `xs[0](y)` is not a link
    pieces = re.split(r"(^```.*?^```[^\n]*$|`[^`\n]*`)", text, flags=re.M | re.S)
    return "".join(p if i % 2 else LINK.sub(repl, p) for i, p in enumerate(pieces))


def launch_bar(binder: str, name: str) -> str:
    """The "Open in Binder" link and the local JupyterLab command for notebooks/``name``."""
    url = f"{binder}?urlpath=lab/tree/notebooks/{name}"
    command = f"jupyter lab notebooks/{name}"
    return (f'<div class="course-launch" data-notebook="notebooks/{name}">\n'
            f'<a class="course-launch-binder" href="{html.escape(url)}">Open in Binder</a>\n'
            f'<span class="course-launch-lab">Open in JupyterLab: '
            f'<code>{html.escape(command)}</code></span>\n</div>\n')


def _controls(state: dict, model_id: str, seen: set[str] | None = None) -> list[str]:
    """'description = value' for each control under ``model_id``, in display order."""
    seen = set() if seen is None else seen
    model = state.get(model_id)
    if model is None or model_id in seen:
        return []
    seen.add(model_id)
    fields = model.get("state", {})
    found = []
    labels, index = fields.get("_options_labels"), fields.get("index")
    if any(kind in model.get("model_name", "") for kind in CONTROL_KINDS):
        if labels and isinstance(index, int) and 0 <= index < len(labels):  # a Dropdown stores
            found.append(f"{fields.get('description') or 'choice'} = {labels[index]}")  # an index
        elif "value" in fields:
            found.append(f"{fields.get('description') or 'value'} = {fields['value']}")
    for child in fields.get("children", []):
        found += _controls(state, str(child).removeprefix("IPY_MODEL_"), seen)
    return found


def _stored_view(state: dict, model_id: str, seen: set[str] | None = None) -> list[str]:
    """HTML for what the widget showed when stored: its Output widgets' outputs, its HTML values."""
    seen = set() if seen is None else seen
    model = state.get(model_id)
    if model is None or model_id in seen:
        return []
    seen.add(model_id)
    fields, parts = model.get("state", {}), []
    if model.get("model_name") == "HTMLModel" and fields.get("value"):
        parts.append(fields["value"])
    for output in fields.get("outputs", []) if model.get("model_name") == "OutputModel" else []:
        data = output.get("data", {})
        text = output.get("text") or data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        if "image/png" in data:
            png = "".join(data["image/png"]).replace("\n", "")
            base64.b64decode(png, validate=True)  # stored data, never trusted blindly
            parts.append(f'<img alt="figure stored with the widget" src="data:image/png;base64,{png}">')
        elif "text/html" in data:
            parts.append("".join(data["text/html"]))
        elif text:
            parts.append(f"<pre>{html.escape(text)}</pre>")
    for child in fields.get("children", []):
        parts += _stored_view(state, str(child).removeprefix("IPY_MODEL_"), seen)
    return parts


def widget_panel(output: dict, state: dict, binder_url: str) -> dict:
    """A display_data output that stands in for a widget: controls, launch hint, stored view."""
    model_id = output["data"][WIDGET_VIEW].get("model_id", "")
    controls = _controls(state, model_id)
    view = _stored_view(state, model_id)
    lines = ['<div class="course-widget">',
             '<p class="course-widget-title">Interactive widget: run it in JupyterLab or '
             f'<a href="{html.escape(binder_url)}">Binder</a> to move its controls.</p>']
    if controls:
        lines.append('<p class="course-widget-controls">Controls: '
                     + " · ".join(f"<code>{html.escape(c)}</code>" for c in controls) + "</p>")
    if view:
        lines.append('<p class="course-widget-note">What it showed at these settings when the '
                     "notebook was stored:</p>")
        lines += view
    lines.append("</div>")
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": "\n".join(lines)}}


def stage_notebook(notebook: dict, name: str, binder: str, pages: set[str], github: str) -> dict:
    """A copy for the site: launch bar after the title, widget panels, links fixed, no widget state."""
    state = notebook.get("metadata", {}).pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    binder_url = f"{binder}?urlpath=lab/tree/notebooks/{name}"
    titled, section = False, name
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            source = fix_links("".join(cell["source"]), "notebooks", pages, github)
            headings = re.findall(r"^#+ +(.+)$", source, re.M)
            section = re.sub(r"[`*_]", "", headings[-1]).strip() if headings else section
            if not titled and re.search(r"^# ", source, re.M):
                source = re.sub(r"^(# .*\n?)", lambda m: m.group(1).rstrip("\n") + "\n\n"
                                + launch_bar(binder, name) + "\n", source, count=1, flags=re.M)
                titled = True
            cell["source"] = source
        if cell["cell_type"] == "code":  # test markers (nbval) are no reading matter
            cell["source"] = re.sub(r"\A(# NBVAL_\w+[^\n]*\n)+", "", "".join(cell["source"]))
            cell.setdefault("metadata", {}).setdefault("mystnb", {}).setdefault(
                "image", {"alt": f"Figure in section: {section}"})  # not the file's hash
        for i, output in enumerate(cell.get("outputs", [])):
            if WIDGET_VIEW in output.get("data", {}):
                cell["outputs"][i] = widget_panel(output, state, binder_url)
    if not titled:
        raise SystemExit(f"notebooks/{name}: no '# ' title in a markdown cell")
    return notebook


def home_page(readme: str, binder: str, pages: set[str], github: str) -> str:
    """The README as the home page: badge made a link, a hidden toctree in course order."""
    text = BADGE.sub(lambda m: f"[Open the course in Binder]({m.group(2)}?urlpath=lab/tree/"
                     "notebooks/00_start_here.ipynb) (JupyterLab in your browser, nothing to install)",
                     readme, count=1)
    text = fix_links(text, "", pages, github)
    chapters = sorted(p[:-6] for p in pages if p.startswith("notebooks/"))
    toc = ["", "```{toctree}", ":hidden:", ":caption: Chapters", "", *chapters, "```", "",
           "```{toctree}", ":hidden:", ":caption: Reference", "", *(d[:-3] for d in DOCS), "```", ""]
    return text.rstrip("\n") + "\n" + "\n".join(toc)


def _write(path: Path, text: str, written: set[Path]) -> None:
    written.add(path)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def stage(out: Path, root: Path = ROOT) -> list[Path]:
    """Write the site's sources under ``out``; remove stale ones. Returns the files written."""
    readme = (root / "README.md").read_text()
    binder = binder_base(readme)
    github = github_base(binder)
    notebooks = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    pages = {f"notebooks/{p.name}" for p in notebooks} | set(DOCS)
    written: set[Path] = set()
    _write(out / "index.md", home_page(readme, binder, pages, github), written)
    for doc in DOCS:
        _write(out / doc, fix_links((root / doc).read_text(), "docs", pages, github), written)
    for image in IMAGE.findall(readme):  # the README's own figures (docs/img/...), as stored
        if not re.match(r"^[a-z][a-z0-9+.-]*:", image) and (root / image).is_file():
            written.add(out / image)
            data = (root / image).read_bytes()
            if not (out / image).exists() or (out / image).read_bytes() != data:
                (out / image).parent.mkdir(parents=True, exist_ok=True)
                (out / image).write_bytes(data)
    for path in notebooks:
        staged = stage_notebook(json.loads(path.read_text()), path.name, binder, pages, github)
        _write(out / "notebooks" / path.name, json.dumps(staged, indent=1) + "\n", written)
    for old in [p for p in out.rglob("*") if p.is_file() and p not in written]:
        old.unlink()
    return sorted(written)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: stage.py OUT_DIR")
    files = stage(Path(sys.argv[1]).resolve())
    print(f"staged {len(files)} pages into {sys.argv[1]}")
