"""How long each chapter takes a learner, counted from the notebook itself; README and notebooks say the same.

``python -m tests.chapter_times`` prints the table; ``--write`` puts each chapter's minutes into the
README's chapter table, the course's total into the README's "Times:" paragraph, and each chapter's
minutes into its notebook's first cell (``**Time:** about N min``); ``--check`` exits 1 when any of
them differs.

The method, stated once here and in the README, is a careful newcomer's pace (reading, running,
writing): prose (markdown outside ``<details>`` folds) at 110 words a minute; code read at 10 lines
a minute; 15 s a code cell to run it, its printed output skimmed at 60 lines a minute and 30 s for
each figure or table it shows; 3 minutes a question exercise (``answer = ...``); a code exercise (a
``def``/``class`` stub) 10 minutes plus 1 a line the learner writes (the solution's lines the stub
does not show), at most 30; 1 minute a check-yourself question. Each chapter is rounded up to 5
minutes. The rates where the issue named none (running, outputs, questions, minutes a written line)
were set so that the count agrees with a teacher's reading of every chapter as a newcomer would do
it (2026-12-07: 00-04 about 465 min, 05-12 about 535; this count gave 485 and 530);
``tests/test_chapter_times.py`` holds that reading's counts and fails when the rates drift from it.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from exercise_cells import Exercise, find_exercises, stubs
else:
    from .exercise_cells import Exercise, find_exercises, stubs

ROOT = Path(__file__).resolve().parents[1]
WPM, CODE_LPM, RUN_S, OUTPUT_LPM, FIGURE_S = 110, 10, 15, 60, 30
QUESTION_MIN, CHECK_YOURSELF_MIN = 3, 1
CODE_EXERCISE_MIN, MIN_PER_LINE_WRITTEN, CODE_EXERCISE_MAX = 10, 1, 30
DETAILS = re.compile(r"<details>.*?</details>", re.S)
CHECK_YOURSELF = re.compile(r"check yourself(.*?)(?=<details>|\u2190|\Z)", re.S | re.I)
TIME_LINE = re.compile(r"\*\*Time:\*\*\s*(?:about\s*)?\d+\s*min\.?|\*Time: about \d+ minutes\.")
TOTAL = re.compile(r"The whole course: about \d+ min \([\d.]+ h\)\.")
ROW = re.compile(r"^(\| (\d\d) \| \[[^\]]*\]\(notebooks/[^)]+\) \|.*\| )(\d+ min|[\d.]+ h)( \| [^|]* \|)$", re.M)
_STRING_START = ('"""', "'''")


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _lines(text: str) -> list[str]:
    """The code lines a reader reads: not blank, not a comment; trailing comments dropped."""
    stripped = (re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def _outputs(cell: dict) -> tuple[int, int]:
    """(printed lines, figures or tables) among a code cell's stored outputs."""
    printed = shown = 0
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if any(kind in data for kind in ("image/png", "image/svg+xml", "text/html")):
            shown += 1
            continue
        text = out.get("text") or data.get("text/plain") or ""
        printed += len(("".join(text) if isinstance(text, list) else text).splitlines())
    return printed, shown


def written_lines(exercise: Exercise) -> int:
    """The lines of a code exercise's solution that the learner writes: those its stub does not show."""
    shown = set(_lines(exercise.source))
    return len([line for line in _lines(exercise.solution)
                if line not in shown and not line.startswith(_STRING_START)])


def code_exercise_minutes(written: int) -> float:
    return min(CODE_EXERCISE_MAX, CODE_EXERCISE_MIN + MIN_PER_LINE_WRITTEN * written)


def counts(cells: list[dict]) -> dict:
    """What the method counts in one notebook's cells."""
    exercises = find_exercises(cells)
    in_exercise = {e.cell for e in exercises}
    markdown = [_src(c) for c in cells if c["cell_type"] == "markdown"]
    code = [c for i, c in enumerate(cells) if c["cell_type"] == "code" and i not in in_exercise]
    outputs = [_outputs(c) for c in code]
    written = [written_lines(e) for e in exercises if stubs(e.source)[1]]
    return {"words": sum(len(DETAILS.sub(" ", m).split()) for m in markdown),
            "code_lines": sum(len(_lines(_src(c))) for c in code), "cells_run": len(code),
            "output_lines": sum(p for p, _ in outputs), "figures": sum(f for _, f in outputs),
            "questions": len(exercises) - len(written), "written": written,
            "check_yourself": sum(m.group(1).count("?") for text in markdown
                                  for m in CHECK_YOURSELF.finditer(text))}


def minutes_of(c: dict) -> int:
    """A chapter's minutes from its counts, by the method above, rounded up to 5."""
    total = (c["words"] / WPM + c["code_lines"] / CODE_LPM + c["cells_run"] * RUN_S / 60
             + c["output_lines"] / OUTPUT_LPM + c["figures"] * FIGURE_S / 60
             + c["questions"] * QUESTION_MIN + sum(map(code_exercise_minutes, c["written"]))
             + c["check_yourself"] * CHECK_YOURSELF_MIN)
    return 5 * math.ceil(total / 5 - 1e-9)


def minutes(path: Path) -> dict:
    """The counts of one notebook and its minutes by the method above."""
    c = counts(json.loads(path.read_text())["cells"])
    return {**c, "exercises": c["questions"] + len(c["written"]),
            "code_exercises": len(c["written"]), "minutes": minutes_of(c)}


def table() -> dict[str, dict]:
    return {p.name[:2]: minutes(p) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}


def _time_text(m: int) -> str:
    return f"**Time:** about {m} min."


def total_text(counts: dict[str, dict]) -> str:
    total = sum(c["minutes"] for c in counts.values())
    return f"The whole course: about {total} min ({total / 60:.1f} h)."


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
    stated = TOTAL.search(new)
    if not stated:
        wrong.append(f"README states no total (a sentence '{total_text(counts)}')")
    elif stated.group(0) != total_text(counts):
        wrong.append(f"README total: {stated.group(0)} (counted {total_text(counts)})")
        new = TOTAL.sub(total_text(counts), new, count=1)
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
    print(f"{'ch':<3}{'words':>7}{'code':>6}{'cells':>6}{'out':>5}{'figs':>5}{'ex':>4}{'code ex':>8}"
          f"{'min':>6}")
    for ch, c in counts.items():
        print(f"{ch:<3}{c['words']:>7}{c['code_lines']:>6}{c['cells_run']:>6}{c['output_lines']:>5}"
              f"{c['figures']:>5}{c['exercises']:>4}{c['code_exercises']:>8}{c['minutes']:>6}")
    print(total_text(counts))
    if "--write" in argv or "--check" in argv:
        wrong = _apply(counts, write="--write" in argv)
        for w in wrong:
            print(("fixed: " if "--write" in argv else "differs: ") + w)
        return 1 if wrong and "--check" in argv else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
