"""docs/decisions/: one file per topic, one entry per question, and every name of an entry resolves.

`docs/decisions.md` is the index (one line per entry: question -> file#anchor). A docstring,
comment, page or notebook that relies on a decision names its entry as
``docs/decisions/<file>.md, "<entry title>"`` (a module note as
``docs/modules/<folder>.md (<module>.py)``); markdown links to ``decisions/<file>.md#anchor``
must land on a heading. Nothing outside docs/ points at the bare index any more: a reference that
names no entry cannot be followed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TOPICS = sorted((DOCS / "decisions").glob("*.md"))
INDEX = (DOCS / "decisions.md").read_text()
MAX_LINES = 400
#: Where references to decisions are looked for.
SEARCHED = ("course_lib", "tools", "tests", "docs", "notebooks", "benchmarks")
NAMED = re.compile(r"docs/(decisions|modules)/([\w.-]+\.md)[`'\"]*,\s*[\"“]([^\"”]+)[\"”]")
NOTE = re.compile(r"docs/modules/([\w.-]+\.md) \((\w+\.py)\)")
LINK = re.compile(r"\]\(((?:\.\./)*(?:docs/)?(?:decisions|modules)/[\w.-]+\.md)(?:#([^)\s]+))?\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    return re.findall(r"^#+ (.*)$", path.read_text(), re.M)


def squash(text: str) -> str:
    """Whitespace as single spaces: line breaks in a docstring, a notebook's source or a comment
    (its ``#`` or ``#:`` continuation included)."""
    return re.sub(r"\s+", " ", re.sub(r"\n[ \t]*#:?(?= )", "\n", text))


def texts():
    """(path, text) of every file that may name a decision; a notebook as its cells' sources."""
    for top in SEARCHED:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix == ".ipynb" and ".ipynb_checkpoints" not in path.parts:
                cells = json.loads(path.read_text())["cells"]
                yield path, "\n".join("".join(c["source"]) for c in cells)
            elif path.suffix in (".py", ".md", ".cfg", ".txt") and path.is_file():
                yield path, path.read_text()


def test_each_topic_file_is_short_and_each_entry_states_status_and_code():
    assert len(TOPICS) >= 12
    bad = {}
    for path in TOPICS:
        text = path.read_text()
        lines = text.count("\n")
        entries = re.split(r"^## ", text, flags=re.M)[1:]
        problems = [f"{lines} lines"] if lines > MAX_LINES else []
        assert entries, path.name
        for entry in entries:
            title, _, body = entry.partition("\n")
            head = squash(body.strip().split("\n\n")[0])
            if not re.match(r"\*\*Status:\*\* (current|superseded|rejected|open)", head):
                problems.append(f"{title}: no status line")
            code = re.search(r"\*\*Code:\*\* (.*?)\. \*\*First recorded as:\*\*", head)
            if not code:
                problems.append(f"{title}: no code line")
                continue
            for name in re.findall(r"`([^`]+)`", code.group(1)):
                if not (REPO / name).exists():
                    problems.append(f"{title}: {name} does not exist")
        if problems:
            bad[path.name] = problems
    assert bad == {}


def test_the_index_lists_every_entry_once_and_its_links_land():
    listed = re.findall(r"^- (.+?) → \[[^\]]+\]\(decisions/([\w.-]+\.md)#([^)]+)\)$", INDEX, re.M)
    assert len(listed) > 80
    by_file = {p.name: headings(p) for p in TOPICS}
    wrong = [(q, f, a) for q, f, a in listed
             if f not in by_file or q not in by_file[f] or anchor(q) != a]
    assert wrong == []
    entries = {(p.name, h) for p in TOPICS for h in re.findall(r"^## (.*)$", p.read_text(), re.M)}
    assert {(f, q) for q, f, _ in listed} == entries
    assert len(listed) == len(entries)


def test_every_named_decision_or_module_note_resolves():
    unresolved, named = [], 0
    for path, text in texts():
        flat = squash(text)
        for kind, name, title in NAMED.findall(flat):
            named += 1
            target = DOCS / kind / name
            if not target.is_file() or title.strip() not in headings(target):
                unresolved.append(f"{path.relative_to(REPO)}: docs/{kind}/{name}, \"{title}\"")
        for name, module in NOTE.findall(flat):
            named += 1
            target = DOCS / "modules" / name
            if not target.is_file() or not any(h.endswith("/" + module) for h in headings(target)):
                unresolved.append(f"{path.relative_to(REPO)}: docs/modules/{name} ({module})")
        for link, frag in LINK.findall(text):
            target = (path.parent / link).resolve()
            if not target.is_file():
                target = (REPO / link.lstrip("./")).resolve()
            named += 1
            if not target.is_file() or (frag and frag not in {anchor(h) for h in headings(target)}):
                unresolved.append(f"{path.relative_to(REPO)}: {link}#{frag}")
    assert named > 40
    assert unresolved == []


def test_nothing_outside_docs_points_at_the_bare_index():
    """`docs/decisions.md` alone names no entry: code, tests and notebooks name the entry."""
    vague = [str(path.relative_to(REPO)) for path, text in texts()
             if path.suffix != ".md" and "decisions.md" in text
             and path.name not in ("test_decisions.py", "test_architecture.py")]
    assert vague == []
    # nor does a page name a section of the old single file ("decisions.md, 'The launcher'")
    old_sections = [f"{path.relative_to(REPO)}: {m}" for path, text in texts()
                    if path.name not in ("test_decisions.py", "test_architecture.py")
                    for m in re.findall(r"decisions\.md[`'\")\]]*,? *[\"“][^\"”]+[\"”]", squash(text))]
    assert old_sections == []


@pytest.mark.parametrize("old", ["Chapters 02 and 05, the lesson pass", "The bubble's excess, taken apart"])
def test_an_old_heading_is_still_found_by_grep(old):
    """The old dated headings live on in each entry's "First recorded as", not as headings."""
    found = [p for p in TOPICS if old in squash(p.read_text())]
    assert found
    assert all(old not in h for p in TOPICS for h in headings(p))


def test_the_index_lists_every_module_note_under_its_page():
    """The "Module notes" list names each page's sections, no more, no fewer."""
    notes = INDEX[INDEX.index("## Module notes"):]
    listed = dict(re.findall(r"^- \[\w+/\]\(modules/([\w.]+\.md)\): (.*)$", notes, re.M))
    pages = sorted(p.name for p in (DOCS / "modules").glob("*.md"))
    assert sorted(listed) == pages
    for page, names in listed.items():
        heads = re.findall(r"^## \w+/(\S+\.py)$", (DOCS / "modules" / page).read_text(), re.M)
        assert sorted(re.findall(r"`([^`]+)`", names)) == sorted(heads), page
