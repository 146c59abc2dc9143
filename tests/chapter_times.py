"""How long each chapter takes a learner, counted from the notebook itself; README and notebooks say the same.

``python -m tests.chapter_times`` prints the table; ``--write`` puts each chapter's minutes into the
README's chapter table and the notebook's first cell (``**Time:** about N min``); ``--check`` exits 1
when either differs. The method, stated once here and in the README: prose (markdown outside
solution blocks) at 150 words per minute, code at 20 lines per minute (reading what a cell does),
20 s per code cell to run it and look at its output, 3 minutes per question exercise and 8 per code
exercise (a ``def``/``class`` stub), rounded up to 5 minutes.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from exercise_cells import find_exercises
else:
    from .exercise_cells import find_exercises

ROOT = Path(__file__).resolve().parents[1]
WPM, CODE_LPM, RUN_S, QUESTION_MIN, CODE_EXERCISE_MIN = 150, 20, 20, 3, 8
DETAILS = re.compile(r"<details>.*?</details>", re.S)
TIME_LINE = re.compile(r"\*\*Time:\*\*\s*(?:about\s*)?\d+\s*min\.?|\*Time: about \d+ minutes\.")
ROW = re.compile(r"^(\| (\d\d) \| \[[^\]]*\]\(notebooks/[^)]+\) \|.*\| )(\d+ min|[\d.]+ h)( \| [^|]* \|)$", re.M)


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def minutes(path: Path) -> dict:
    """The counts of one notebook and its minutes by the method above."""
    cells = json.loads(path.read_text())["cells"]
    exercises = find_exercises(cells)
    ex_cells = {e.cell for e in exercises}
    words = sum(len(DETAILS.sub(" ", _src(c)).split()) for c in cells if c["cell_type"] == "markdown")
    code = [c for i, c in enumerate(cells) if c["cell_type"] == "code" and i not in ex_cells]
    lines = sum(len([l for l in _src(c).splitlines() if l.strip() and not l.strip().startswith("#")])
                for c in code)
    coded = sum(1 for e in exercises if re.search(r"^\s*(def|class) ", e.source, re.M))
    total = (words / WPM + lines / CODE_LPM + len(code) * RUN_S / 60
             + (len(exercises) - coded) * QUESTION_MIN + coded * CODE_EXERCISE_MIN)
    return {"words": words, "code_lines": lines, "cells_run": len(code),
            "exercises": len(exercises), "code_exercises": coded,
            "minutes": 5 * math.ceil(total / 5)}


def table() -> dict[str, dict]:
    return {p.name[:2]: minutes(p) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}


def _time_text(m: int) -> str:
    return f"**Time:** about {m} min."


def _apply(counts: dict[str, dict], write: bool) -> list[str]:
    """Differences between the counts and what README/notebooks say; fixed in place when ``write``."""
    wrong = []
    readme = (ROOT / "README.md").read_text()

    def row(match: re.Match) -> str:
        want = f"{counts[match.group(2)]['minutes']} min" if match.group(2) in counts else match.group(3)
        if want != match.group(3):
            wrong.append(f"README row {match.group(2)}: {match.group(3)} (counted {want})")
        return match.group(1) + want + match.group(4)
    new = ROW.sub(row, readme)
    missing = set(counts) - set(m.group(2) for m in ROW.finditer(readme))
    wrong += [f"README has no chapter row {n}" for n in sorted(missing)]
    if write and new != readme:
        (ROOT / "README.md").write_text(new)
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        first = _src(nb["cells"][0])
        text = _time_text(counts[path.name[:2]]["minutes"])
        found = TIME_LINE.search(first)
        if found and found.group(0) == text:
            continue
        wrong.append(f"{path.name}: {found.group(0) if found else 'no time line'} (counted {text})")
        if write:
            fixed = TIME_LINE.sub(text, first, count=1) if found else first.rstrip("\n") + "\n\n" + text
            nb["cells"][0]["source"] = fixed.splitlines(True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return wrong


def main(argv: list[str]) -> int:
    counts = table()
    print(f"{'ch':<3}{'words':>7}{'code':>6}{'cells':>6}{'ex':>4}{'code ex':>8}{'min':>6}")
    for ch, c in counts.items():
        print(f"{ch:<3}{c['words']:>7}{c['code_lines']:>6}{c['cells_run']:>6}{c['exercises']:>4}"
              f"{c['code_exercises']:>8}{c['minutes']:>6}")
    total = sum(c["minutes"] for c in counts.values())
    print(f"all {len(counts)} chapters: {total} min ({total / 60:.1f} h)")
    if "--write" in argv or "--check" in argv:
        wrong = _apply(counts, write="--write" in argv)
        for w in wrong:
            print(("fixed: " if "--write" in argv else "differs: ") + w)
        return 1 if wrong and "--check" in argv else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
