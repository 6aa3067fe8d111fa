"""Wrong solutions (mutants) that the chapters' tests must fail, while the reference passes.

Each mutant is the released chapter (stubs) plus one plausible wrong or delegating answer;
the test named beside it must fail it, and the message says why.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from minigraph.grading import grade, strip_solutions

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"

MUTANTS = {
    # delegation: one line calling the library (or NumPy) instead of the algorithm
    "broadcast-by-numpy": ("01-tensors-and-devices", "test_broadcast_shape_matches_minigraph",
                           "import numpy as np\ndef broadcast_shape(a, b):\n"
                           "    return tuple(np.broadcast_shapes(a, b))\n", "ForbiddenCall"),
    "rendezvous-from-the-library": ("06-multi-device-execution",
                                    "test_rendezvous_behaves_like_minigraphs",
                                    "from minigraph.runtime.rendezvous import Rendezvous\n",
                                    "ForbiddenCall"),
    # by rows with mg.jacrev where the exercise asks for columns by forward mode
    "columns-by-jacrev": ("03-ad-on-dataflow-graphs", "test_jacobian_by_columns",
                          "import minigraph as mg\ndef jacobian_by_columns(f, x):\n"
                          "    return mg.jacrev(f)(x).numpy()\n", "ForbiddenCall"),
    # by columns, computed from rows of mg.vjp: right values, wrong number of passes
    "columns-by-vjp-rows": ("03-ad-on-dataflow-graphs", "test_jacobian_by_columns",
                            "import numpy as np, minigraph as mg\n"
                            "def jacobian_by_columns(f, x):\n"
                            "    out, vjp = mg.vjp(f, x)\n"
                            "    rows = [vjp(mg.tensor(np.eye(out.size)[i]))[0].numpy()"
                            " for i in range(out.size)]\n"
                            "    return np.stack(rows)\n", "f ran 1 times"),
}


@pytest.fixture(scope="module")
def mutant_reports(tmp_path_factory):
    work = tmp_path_factory.mktemp("mutants")

    def run(name):
        chapter, _, code, _ = MUTANTS[name]
        folder = work / name / chapter
        folder.mkdir(parents=True)
        stub = strip_solutions((CHAPTERS / chapter / "exercises.py").read_text())
        (folder / "exercises.py").write_text(stub + "\n\n" + code)
        return grade(folder, timeout=30.0)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, name) for name in MUTANTS}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_exercise_fails_the_mutant(mutant_reports, name):
    _, test, _, why = MUTANTS[name]
    result = next(r for r in mutant_reports[name].results if r.name == test)
    assert result.status == "failed", mutant_reports[name].table(width=200)
    assert why in result.output
