"""Every Python block of README.md and of each chapter's README runs as written.

A file's ```` ```python ```` blocks run in order, in one fresh interpreter, sharing their
names as a reader's session would. The fence's info string may say more:

- ```` ```python no-run ````: a fragment not meant to run (a sketch, a student's stub);
- ```` ```python cupy ````: needs CuPy and a CUDA GPU; runs only where both exist;
- ```` ```python raises=DeviceError ````: shows an error; the block must raise exactly
  that exception (its class name), so a message the text promises cannot vanish.

Each block is compiled under the README's own path, padded to its own line numbers: a
failure names the Markdown file and line, and a function a block defines has its text
where ``inspect`` looks for it, as it would in a script (source transformation reads it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})python(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
FLAGS = {"no-run", "cupy"}


def markdown_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted(ROOT.glob("chapters/[0-9][0-9]-*/README.md"))


def python_blocks(path: Path) -> list[dict]:
    """The ```python blocks of a Markdown file: line of the first code line, code, flags."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        words = m.group("info").split()
        flags = {w for w in words if w in FLAGS}
        raises = [w.split("=", 1)[1] for w in words if w.startswith("raises=")]
        unknown = [w for w in words if w not in FLAGS and not w.startswith("raises=")]
        line = text.count("\n", 0, m.start("body")) + 1
        assert not unknown, f"{path.name}:{line - 1}: unknown fence flag(s) {unknown}"
        body = "\n".join(ln[len(m.group("indent")):] for ln in m.group("body").split("\n"))
        blocks.append({"line": line, "code": body, "flags": sorted(flags),
                       "raises": raises[0] if raises else None})
    return blocks


# The driver runs in the fresh interpreter: it executes the blocks one after the other in
# one namespace, each compiled with the README's path and line numbers.
DRIVER = r'''
import json, sys, traceback
path, abspath, blocks, gpu = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4] == "1"
ns = {"__name__": "__main__"}
for b in blocks:
    where = f"{path}:{b['line']}"
    if "no-run" in b["flags"] or ("cupy" in b["flags"] and not gpu):
        print(f"skipped {where} {b['flags']}")
        continue
    code = compile("\n" * (b["line"] - 1) + b["code"], abspath, "exec")
    try:
        exec(code, ns)
    except BaseException as e:
        if b["raises"] and type(e).__name__ == b["raises"]:
            print(f"ok {where}: raised {type(e).__name__} as the fence says")
            continue
        traceback.print_exc()
        print(f"FAILED: the block at {where} raised {type(e).__name__}", file=sys.stderr)
        sys.exit(1)
    if b["raises"]:
        print(f"FAILED: the block at {where} should raise {b['raises']} and did not", file=sys.stderr)
        sys.exit(1)
    print(f"ok {where}")
'''


def has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def test_fences_are_found():
    """The extractor sees blocks, flags and line numbers (so the test below can fail)."""
    text = "x\n```python no-run\nthis is not python\n```\n\n```python raises=ValueError\nint('a')\n```\n"
    path = ROOT / "tests" / "_fence_probe.md"
    try:
        path.write_text(text)
        blocks = python_blocks(path)
    finally:
        path.unlink()
    assert [(b["line"], b["flags"], b["raises"]) for b in blocks] == [
        (3, ["no-run"], None), (7, [], "ValueError")]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(path, tmp_path):
    blocks = python_blocks(path)
    if not blocks:
        pytest.skip(f"{path.relative_to(ROOT)} has no python blocks")
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps(blocks))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(path.relative_to(ROOT)), str(path), str(spec),
         "1" if has_gpu() else "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (
        f"a code block of {path.relative_to(ROOT)} fails as written:\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
