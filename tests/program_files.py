"""Random programs as real files: source transformation reads a function's text, so a
program that hypothesis writes must be defined in a file, not with exec."""

from __future__ import annotations

import importlib.util
import itertools
from typing import Any, Callable

_counter = itertools.count()


def load_module(text: str, tmp_path_factory: Any) -> Any:
    """``text`` as a module of its own, in a file, imported."""
    k = next(_counter)
    path = tmp_path_factory.mktemp("programs") / f"prog{k}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"prog{k}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_pair(source_of: Callable[[Any, str, str], str], prog: Any,
              tmp_path_factory: Any) -> tuple:
    """``prog`` written twice, as ``f`` in minigraph and ``f_torch`` in PyTorch (by
    ``source_of(prog, namespace, name)``), in one file of its own, imported: (f, f_torch)."""
    module = load_module("import minigraph as mg\nimport torch\n\n" + source_of(prog, "mg", "f")
                         + "\n\n" + source_of(prog, "torch", "f_torch"), tmp_path_factory)
    return module.f, module.f_torch
