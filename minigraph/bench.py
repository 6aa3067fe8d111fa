"""``minigraph bench``: run the benchmark scripts and keep their results page current.

The scripts live in the repository's ``benchmarks/`` folder (they are not installed with
the package). Each prints its tables (ratios against NumPy, PyTorch and the other
anchors, measured in the same run), writes JSON and PNG files under
``benchmarks/results/`` and says, on lines starting with ``target:``, which of DESIGN.md's
targets it met. This module runs them one after the other (``[k/n]`` shows progress),
shows their output as it comes and keeps it in ``results/NAME.txt``, and then rewrites
the generated part of ``benchmarks/README.md`` (between ``<!-- results: begin -->`` and
``<!-- results: end -->``) from the latest output of every script: the targets first,
each script's full output after. Running one script updates its part only.

``minigraph bench --device cuda:0`` runs the scripts with ``MINIGRAPH_BENCH_DEVICE`` set:
those that compare libraries on arrays run there (CuPy, and PyTorch on CUDA, as the
anchors), the others say why they stay on the CPU. Their output is kept apart
(``results/NAME-cuda0.txt``) and shown in its own sections of the page.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import runpy
import sys
import time
from pathlib import Path
from typing import Sequence, TextIO

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
BEGIN, END = "<!-- results: begin -->", "<!-- results: end -->"


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, terminal: TextIO):
        self.terminal, self.copy = terminal, io.StringIO()

    def write(self, text: str) -> int:
        self.terminal.write(text)
        self.terminal.flush()
        return self.copy.write(text)


DEVICE_VAR = "MINIGRAPH_BENCH_DEVICE"  # read by benchmarks/common.py


def run(names: Sequence[str] = (), device: str = "cpu") -> int:
    """Run ``bench_*.py`` (all, or those whose name contains one of ``names``) on
    ``device``."""
    if not BENCHMARKS.is_dir():
        print(f"minigraph bench runs the scripts in the repository's benchmarks/ folder, "
              f"which is not next to this installation ({BENCHMARKS}); install from a clone "
              f"with `pip install -e .`", file=sys.stderr)
        return 2
    every = sorted(BENCHMARKS.glob("bench_*.py"))
    scripts = [p for p in every if not names or any(n in p.stem for n in names)]
    if not scripts:
        print(f"no benchmark matches {list(names)}; there are {[p.stem for p in every]}",
              file=sys.stderr)
        return 2
    try:
        from .device import get_device
        get_device(device)  # a missing GPU or CuPy is said here, before anything runs
    except Exception as exc:  # noqa: BLE001  (DeviceError, ValueError: reported as they are)
        print(f"minigraph bench --device {device}: {exc}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their helpers from common.py
    saved = BENCHMARKS / "results"
    saved.mkdir(exist_ok=True)
    suffix = "" if device == "cpu" else "-" + device.replace(":", "")
    previous = os.environ.get(DEVICE_VAR)
    os.environ[DEVICE_VAR] = device
    failed: list[str] = []  # scripts that ended with sys.exit(<an error>)
    try:
        for k, script in enumerate(scripts, 1):
            print(f"\n[{k}/{len(scripts)}] {script.stem} on {device} " + "=" * 40, flush=True)
            start, tee = time.perf_counter(), _Tee(sys.stdout)
            argv, sys.argv = sys.argv, [str(script)]  # a script sees its own command line
            try:
                with contextlib.redirect_stdout(tee):
                    runpy.run_path(str(script), run_name="__main__")
            except SystemExit as end:  # a script's sys.exit() ends the script, not the run
                if end.code not in (None, 0):  # ... but the run's status says it failed
                    print(f"{script.stem} ended with {end.code!r}", file=sys.stderr)
                    failed.append(script.stem)
            finally:
                sys.argv = argv
            header = (f"{time.strftime('%Y-%m-%d %H:%M')} {time.perf_counter() - start:.0f} "
                      f"{device}\n")
            kept = saved / f"{script.stem}{suffix}.txt"
            if tee.copy.getvalue().startswith(f"{device}: skipped"):  # measures CPUs only
                kept.unlink(missing_ok=True)  # (no section of its own on the page)
            else:
                kept.write_text(header + tee.copy.getvalue())
    finally:
        if previous is None:
            os.environ.pop(DEVICE_VAR, None)
        else:
            os.environ[DEVICE_VAR] = previous
    outputs = {p.stem: p.read_text().split("\n", 1)  # bench_x, then bench_x-cuda0
               for p in sorted(saved.glob("bench_*.txt"), key=lambda p: p.stem.split("-"))}
    print("\n" + "=" * 60 + "\nTargets (DESIGN.md), from the latest output of every script:")
    for line in targets(outputs):
        print(line)
    readme = BENCHMARKS / "README.md"
    if update_readme(readme, outputs):
        print(f"\nupdated the generated results in {readme}")
    print(f"results (JSON, PNG): {BENCHMARKS / 'results'}")
    if failed:
        print(f"these scripts did not finish: {', '.join(failed)} (their errors are above)",
              file=sys.stderr)
        return 1
    return 0


def update_readme(readme: Path, outputs: dict[str, list[str]]) -> bool:
    """Replace the text between the markers with this run's targets and outputs. A section
    already on the page whose script this machine has no output of (a GPU run's, made on
    another machine) is kept as it is, while its script exists."""
    text = readme.read_text() if readme.exists() else ""
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    generated, tail = rest.split(END, 1)
    kept = {name: section for name, section in sections(generated).items()
            if (BENCHMARKS / f"{name.split('-')[0]}.py").exists()}
    merged = dict(sorted({**kept, **outputs}.items(), key=lambda item: item[0].split("-")))
    return bool(readme.write_text(head + BEGIN + "\n" + render(merged) + END + tail))


# A section as render writes it: "### `bench_x.py` on cuda:0 (2026-11-26 13:06, 16 s)",
# a blank line, then the output in a fenced block, which ends where the next section or the
# generated part (its end marker) does.
_SECTION = re.compile(r"^### `(bench_\w+)\.py`(?: on (\S+))? \((\S+) (\S+), (\S+) s\)\n\n"
                      r"```\n(.*?)\n```(?=\n\n### |\n*(?:<!--|\Z))", re.MULTILINE | re.DOTALL)


def sections(generated: str) -> dict[str, list[str]]:
    """The sections of a page's generated part, read back in the form ``render`` takes."""
    found = {}
    for script, device, day, hour, seconds, out in _SECTION.findall(generated):
        device = device or "cpu"
        name = script if device == "cpu" else f"{script}-{device.replace(':', '')}"
        found[name] = [f"{day} {hour} {seconds} {device}", out + "\n"]
    return found


def targets(outputs: dict[str, list[str]]) -> list[str]:
    """The ``target:`` lines of every script's output, as Markdown list items."""
    return [f"- `{name}`: {line.strip()[len('target: '):]}"
            for name, (_, out) in outputs.items()
            for line in out.splitlines() if line.strip().startswith("target:")]


def render(outputs: dict[str, list[str]]) -> str:
    """Markdown: where, the target lines of every script, then each output with its date.
    ``outputs[name]`` is [``"date time seconds device"``, the script's output]."""
    lines = [f"Generated by `minigraph bench` on {platform.machine()}, Python "
             f"{platform.python_version()}.", "", "Targets:", ""] + targets(outputs)
    for name, (header, out) in outputs.items():
        day, hour, seconds, *device = header.split()  # (no device: a run from before --device)
        where = f" on {device[0]}" if device and device[0] != "cpu" else ""
        script = name.split("-")[0]
        lines += ["", f"### `{script}.py`{where} ({day} {hour}, {seconds} s)", "", "```",
                  out.strip(), "```"]
    return "\n".join(lines) + "\n"
