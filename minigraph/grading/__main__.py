"""``python -m minigraph.grading grade|release|autograder|check ...``: the grading commands on their own."""

from __future__ import annotations

import argparse
import sys

from minigraph.grading.autograder import add_autograder_parser
from minigraph.grading.check import check_chapter
from minigraph.grading.grade import add_grade_parser
from minigraph.grading.release import add_release_parser


def _run_check(args) -> int:
    bad = 0
    for folder in args.chapters:
        problems = check_chapter(folder)
        bad += bool(problems)
        print(f"{folder}: {'ok' if not problems else f'{len(problems)} problems'}")
        for problem in problems:
            print(f"  {problem}")
    return 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigraph.grading")
    sub = parser.add_subparsers(dest="command", required=True)
    add_grade_parser(sub)
    add_release_parser(sub)
    add_autograder_parser(sub)
    check = sub.add_parser("check", help="check chapter folders against the authors' contract")
    check.add_argument("chapters", nargs="+", metavar="CHAPTER_DIR")
    check.set_defaults(run=_run_check)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
