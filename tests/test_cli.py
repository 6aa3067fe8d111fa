"""The command line: bench's results page (demo is tested in test_textbook.py, grade and
release in test_grading.py)."""

from __future__ import annotations

import pytest

import minigraph as mg
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


def test_a_device_run_gets_sections_of_its_own(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{bench.BEGIN}\n{bench.END}\n")
    outputs = {"bench_x": ["2026-11-22 08:00 12 cpu", "cpu table\n"],
               "bench_x-cuda0": ["2026-11-22 09:00 30 cuda:0", "gpu table\n"]}
    assert bench.update_readme(readme, outputs)
    text = readme.read_text()
    assert "### `bench_x.py` (2026-11-22 08:00, 12 s)" in text
    assert "### `bench_x.py` on cuda:0 (2026-11-22 09:00, 30 s)" in text


def test_a_run_keeps_the_sections_it_has_no_output_of(tmp_path, monkeypatch):
    """The GPU's sections are made on another machine: a CPU run here, with no GPU output
    in its results folder, once dropped them from the page. A deleted script's go."""
    monkeypatch.setattr(bench, "BENCHMARKS", tmp_path)
    for name in ("bench_x", "bench_y"):
        (tmp_path / f"{name}.py").write_text("")
    readme = tmp_path / "README.md"
    readme.write_text(f"{bench.BEGIN}\n{bench.END}\n")
    gpu = {"bench_x-cuda0": ["2026-11-22 09:00 30 cuda:0", "gpu table\n```\nnot a fence\n"],
           "bench_gone-cuda0": ["2026-11-22 09:00 3 cuda:0", "old\n"]}
    assert bench.update_readme(readme, gpu)
    assert bench.sections(readme.read_text()) == gpu  # render's sections, read back
    cpu = {"bench_x": ["2026-11-23 08:00 12 cpu", "cpu table\ntarget: t  (met)\n"],
           "bench_y": ["2026-11-23 08:01 2 cpu", "y\n"]}
    assert bench.update_readme(readme, cpu)
    text = readme.read_text()
    assert bench.sections(text) == {**cpu, "bench_x-cuda0": gpu["bench_x-cuda0"]}
    assert text.index("### `bench_x.py` (") < text.index("### `bench_x.py` on cuda:0") \
        < text.index("### `bench_y.py`")
    assert "- `bench_x`: t  (met)" in text


def test_bench_on_a_missing_device_says_what_is_missing_before_running(capsys):
    if mg.cuda_available():
        pytest.skip("this machine has CuPy and a GPU")
    assert main(["bench", "--device", "cuda:0", "bench_eager"]) == 2
    err = capsys.readouterr().err
    assert "minigraph bench --device cuda:0" in err and "CuPy" in err


def test_bench_runs_every_script_and_fails_when_one_exits_with_an_error(tmp_path, monkeypatch,
                                                                       capsys):
    """A script's sys.exit ends that script only; the run goes on with the next, sees its
    own command line, and its status says that one did not finish."""
    (tmp_path / "bench_a.py").write_text("import sys\nsys.exit('mpiexec not found')\n")
    (tmp_path / "bench_b.py").write_text("import sys\nprint('b ran with', sys.argv[1:])\n")
    monkeypatch.setattr(bench, "BENCHMARKS", tmp_path)
    monkeypatch.setattr("sys.argv", ["minigraph", "bench", "--not-for-the-scripts"])
    assert bench.run() == 1
    out, err = capsys.readouterr()
    assert "b ran with []" in out
    assert "bench_a ended with 'mpiexec not found'" in err and "did not finish: bench_a" in err
    (tmp_path / "bench_a.py").write_text("import sys\nsys.exit(0)\n")
    assert bench.run() == 0


def test_demo_runs_without_pytest_and_grade_says_what_is_missing():
    """The command imported the course tools at start, and they import pytest: without
    it (the library's own dependencies are NumPy and array-api-compat) every command,
    demo and --help too, ended in ModuleNotFoundError."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['pytest'] = None\n"
            "from minigraph.cli import main\n"
            "assert main(['demo']) == 0\n"
            "sys.exit(main(['grade', 'submission', '--json', 'r.json']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "(a.1)" in done.stdout
    assert "minigraph grade: import of pytest halted" in done.stderr
    assert "pip install 'minigraph[grading]'" in done.stderr
