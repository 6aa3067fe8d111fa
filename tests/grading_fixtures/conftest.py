"""Keep pytest out of this folder: it holds a chapter and student copies that only
tests/test_grading.py runs, through the grader."""

collect_ignore_glob = ["*"]
