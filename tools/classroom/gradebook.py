"""The gradebook: a CSV (otter-grader's layout) and an HTML page of each student's feedback.

``gradebook.csv`` has one row per submitted notebook: ``file``, ``chapter``, one column per
exercise (``<chapter>: <name>``, 1 or 0; ``review`` for a verdict the grader could not make
outside the submission, not counted; empty for another chapter's), ``total``, ``possible``,
``percent_correct`` and ``error`` (a notebook the grader could not grade). ``feedback.html`` lists
each notebook's exercises with the check's own messages (they never contain the solution) and,
folded under a failed one, what the failure left (a rank's traceback and output, trimmed).
"""
from __future__ import annotations

import csv
import html
import os
from pathlib import Path

from tools.classroom.grade import Result


def write_gradebook(results: list[Result], out_dir: Path) -> tuple[Path, Path]:
    """Write ``gradebook.csv`` and ``feedback.html`` into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = []
    for r in results:
        columns += [f"{r.chapter}: {e.name}" for e in r.exercises
                    if f"{r.chapter}: {e.name}" not in columns]
    csv_path = out_dir / "gradebook.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "chapter", *columns, "total", "possible", "percent_correct",
                         "error"])
        for r in results:
            got = {f"{r.chapter}: {e.name}": "review" if e.review else int(e.passed)
                   for e in r.exercises}
            possible = r.possible
            writer.writerow([r.file, r.chapter or "", *(got.get(c, "") for c in columns), r.score,
                             possible, f"{100 * r.score / possible:.1f}" if possible else "",
                             r.error or ""])
    rows = []
    files = [str(Path(r.file).resolve()) for r in results]
    base = os.path.commonpath([os.path.dirname(f) for f in files]) if files else ""
    for r, full in zip(results, files):
        shown = os.path.relpath(full, base) if base else Path(r.file).name
        head = f"{html.escape(shown)} — {html.escape(r.chapter or 'unknown chapter')}"
        rows.append(f"<h2>{head}: {r.score} / {r.possible}</h2>")
        if r.error:
            rows.append(f"<p class='error'>Not graded: {html.escape(r.error)}</p>")
        rows.append("<ul>")
        for e in r.exercises:
            mark = "passed" if e.passed else "not yet"
            mark = f"to review (its own check said {mark})" if e.review else mark
            lines = "".join(f"<li>{html.escape(line)}</li>" for line in e.feedback)
            if e.details:   # a failure's traceback and output, trimmed: folded under the lines
                lines += ("<li><details><summary>what your code left: traceback and output "
                          "(trimmed)</summary><pre style='white-space: pre-wrap'>"
                          f"{html.escape(e.details)}</pre></details></li>")
            rows.append(f"<li class='{'review' if e.review else mark.replace(' ', '-')}'><b>{html.escape(e.name)}</b>: "
                        f"{mark}<ul>{lines}</ul></li>")
        rows.append("</ul>")
    html_path = out_dir / "feedback.html"
    html_path.write_text("<!doctype html><meta charset='utf-8'><title>Feedback</title>"
                         "<style>.passed{color:#176f2c}.not-yet{color:#a4262c}.error{color:#a4262c}"
                         "</style><h1>Feedback per notebook</h1>\n" + "\n".join(rows) + "\n")
    return csv_path, html_path
