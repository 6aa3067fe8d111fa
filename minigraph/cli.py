"""The ``minigraph`` command: ``demo`` prints the textbook's example; ``bench`` runs the
benchmarks of the repository's ``benchmarks/`` folder; ``grade`` and ``release`` are the
course tools (``minigraph/grading/``).

``demo`` evaluates z = x*y + sin(x) at x = 2, y = 3, prints the evaluation trace
(a.1)-(a.5), the two forward-mode traces (c.*) and (d.*), the reverse adjoint trace
(g.*), and then the gradient computed by every mode minigraph has, beside the closed
form dz/dx = y + cos x, dz/dy = x.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from types import ModuleType
from typing import Sequence

import minigraph as mg
from minigraph import bench
from minigraph.autodiff.explain import explain

grading: ModuleType | None
try:  # the course tools run pytest: the [grading] and [dev] extras bring it, the library
    grading = importlib.import_module("minigraph.grading")  # and demo, bench, book none
except ImportError as missing:  # (pytest, not installed)
    grading = None
    _WHY = f"{missing}; install the course tools with pip install 'minigraph[grading]'"


def textbook_f(x, y):
    """The textbook's worked example: z = x*y + sin(x)."""
    return x * y + mg.sin(x)


def gradients_by_every_mode(x: float = 2.0, y: float = 3.0) -> dict[str, tuple[float, float]]:
    """(dz/dx, dz/dy) from each way minigraph can differentiate."""
    results = {}
    for mode in mg.MODES:
        gx, gy = mg.grad(textbook_f, argnums=(0, 1), mode=mode)(x, y)
        results[f'grad(mode="{mode}")'] = (gx.item(), gy.item())
    tx, ty = mg.tensor(x, requires_grad=True), mg.tensor(y, requires_grad=True)
    textbook_f(tx, ty).backward()
    assert tx.grad is not None and ty.grad is not None  # (backward() set them)
    results["z.backward()"] = (tx.grad.item(), ty.grad.item())
    for mode in mg.REVERSE_MODES:
        gx, gy = mg.vjp(textbook_f, x, y, mode=mode)[1](1.0)
        results[f'vjp(f, x, y, mode="{mode}")'] = (gx.item(), gy.item())
    results["jvp(f, tangents (1,0) / (0,1))"] = tuple(
        mg.jvp(textbook_f, (x, y), t)[1].item() for t in ((1.0, 0.0), (0.0, 1.0)))
    return results


def demo() -> int:
    x, y = 2.0, 3.0
    print("The textbook's example: z = x*y + sin(x) at x = 2, y = 3\n")
    print(explain(textbook_f, x=x, y=y))
    exact = (y + math.cos(x), x)
    print(f"\nClosed form: dz/dx = y + cos(x) = 3 + cos 2 = {exact[0]!r}, dz/dy = x = {exact[1]!r}")
    print("\nThe same gradient from every mode:")
    width = 34
    print(f"  {'method':<{width}} {'dz/dx':>20} {'dz/dy':>8}  agrees")
    ok = True
    for name, (gx, gy) in gradients_by_every_mode(x, y).items():
        agrees = math.isclose(gx, exact[0], rel_tol=1e-12) and math.isclose(gy, exact[1])
        ok &= agrees
        print(f"  {name:<{width}} {gx!r:>20} {gy!r:>8}  {'yes' if agrees else 'NO'}")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minigraph", description="minigraph: automatic differentiation and dataflow graphs")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="print the textbook example's traces and gradients")
    run_bench = sub.add_parser("bench", help="run the benchmarks (tables, plots, JSON)")
    run_bench.add_argument("names", nargs="*", help="only benchmarks whose name contains these")
    run_bench.add_argument("--device", default="cpu",
                           help="run on this device, e.g. cuda:0 (needs CuPy and a GPU; the "
                                "targets are set for the CPU)")
    if grading is not None:
        grading.add_grade_parser(sub)    # minigraph grade PATH [--json results.json] ...
        grading.add_release_parser(sub)  # minigraph release chapters -o DIR
        grading.add_autograder_parser(sub)  # minigraph autograder CHAPTER -o DIR
    else:
        for name in ("grade", "release", "autograder"):
            tool = sub.add_parser(name, help=f"(unavailable: {_WHY})", add_help=False)
            tool.add_argument("rest", nargs=argparse.REMAINDER)  # (whatever was given)
            tool.set_defaults(run=_unavailable)
    run_book = sub.add_parser("book", help="build the course as a static web site in OUT")
    run_book.add_argument("out", help="the folder to write the site into (OUT/index.html)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    if args.command == "bench":
        return bench.run(args.names, args.device)
    if args.command == "book":
        from minigraph import book  # Sphinx is imported only when the book is built

        return book.build(args.out)
    return args.run(args)


def _unavailable(args: argparse.Namespace) -> int:
    print(f"minigraph {args.command}: {_WHY}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
