"""The command line: bench's results page (demo is tested in test_textbook.py, grade and
release in test_grading.py)."""

from __future__ import annotations

from minigraph import bench
from minigraph.cli import main


def test_bench_rewrites_only_the_generated_part_of_the_results_page(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\nhand-written text\n{bench.BEGIN}\nold\n{bench.END}\nafter\n")
    outputs = {"bench_x": ["2026-11-22 08:00 12", "table\ntarget: x <= 1.0x  (met: 0.9x)\n"]}
    assert bench.update_readme(readme, outputs)
    text = readme.read_text()
    assert text.startswith("# Benchmarks\nhand-written text\n") and text.endswith("after\n")
    assert "old" not in text
    assert "- `bench_x`: x <= 1.0x  (met: 0.9x)" in text
    assert "### `bench_x.py` (2026-11-22 08:00, 12 s)" in text


def test_bench_leaves_a_page_without_markers_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    assert not bench.update_readme(readme, {"bench_x": ["2026-11-22 08:00 1", "out"]})
    assert readme.read_text() == "no markers here\n"


def test_bench_names_the_benchmarks_when_none_matches(capsys):
    assert main(["bench", "no-such-benchmark"]) == 2
    assert "bench_eager" in capsys.readouterr().err
