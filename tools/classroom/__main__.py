"""The command line: ``student`` writes the student edition, ``grade`` grades a folder."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tools.classroom.edition import CHAPTERS, write_edition
from tools.classroom.grade import SandboxUnavailable, grade_folder
from tools.classroom.gradebook import write_gradebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.classroom")
    sub = parser.add_subparsers(dest="command", required=True)
    student = sub.add_parser("student", help="write the notebooks without their solutions")
    student.add_argument("out_dir", type=Path)
    student.add_argument("notebooks", nargs="*", type=Path, help="default: every chapter")
    grade = sub.add_parser("grade", help="grade a folder of submitted notebooks")
    grade.add_argument("submissions", type=Path)
    grade.add_argument("out_dir", type=Path, help="gradebook.csv and feedback.html go here")
    grade.add_argument("--time-limit", type=float, default=120.0,
                       help="seconds per exercise (default 120)")
    grade.add_argument("--output-cap", type=int, default=100_000,
                       help="bytes of output an exercise may print (default 100000)")
    grade.add_argument("--trusted", action="store_true",
                       help="grade without a sandbox where none can be made (work you trust)")
    grade.add_argument("--jobs", type=int, default=None,
                       help="submissions graded at once, each in its own sandboxes (default: one "
                            "per core, fewer where memory is short)")
    args = parser.parse_args(argv)
    if args.command == "student":
        written = write_edition(args.notebooks or CHAPTERS, args.out_dir)
        for path, removed in written:
            print(f"{path}: {removed}")
        return 0
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder")
    if args.time_limit <= 0 or args.output_cap <= 0 or (args.jobs is not None and args.jobs <= 0):
        parser.error("--time-limit, --output-cap and --jobs must be positive")
    start = time.monotonic()
    try:
        results = grade_folder(args.submissions, time_limit=args.time_limit,
                               output_cap=args.output_cap, progress=print,
                               trusted=args.trusted, hide=(args.out_dir,), jobs=args.jobs)
    except SandboxUnavailable as err:
        print(f"python -m tools.classroom grade: {err}", file=sys.stderr)
        return 2
    csv_path, html_path = write_gradebook(results, args.out_dir)
    print(f"graded {len(results)} notebooks in {time.monotonic() - start:.0f} s: "
          f"{csv_path}, {html_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
