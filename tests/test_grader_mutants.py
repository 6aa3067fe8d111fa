"""Wrong solutions (mutants) that the chapters' tests must fail, while the reference passes.

Every exercise of every chapter has at least one mutant: a plausible wrong answer (the
gradient of the whole batch copied to every device, a scalar gradient for a vector
input, a Jacobian by rows posing as columns) or a one-line delegation to the library or
NumPy that the exercise forbids. A mutant is the released chapter (stubs) with the
mutant's definitions appended; the tests named beside it must fail it, with the words
given in their message.

To stay cheap, the mutants of one chapter go into one submission, graded once (a
"set"): each mutant replaces a different exercise, and each exercise's tests call only
that exercise, so they do not disturb each other. A second set holds the second mutant
of an exercise that has two. Every test of a set must fail (score 0): a test that
passes there would pass without a right answer. That the reference solutions keep full
marks is proven in tests/test_grading.py (test_chapter_solutions_score_full_marks_on_their_own).
"""

from __future__ import annotations

import ast
import re
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from minigraph.grading import grade, strip_solutions
from minigraph.grading.release import solution_regions

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
FORBIDDEN = "ForbiddenCall"

# One sum handed to every device (right values, one array): the grader can tell only in
# the sandbox, where the arrays live (what crosses to it is a fresh copy)
ONE_SUM_FOR_EVERY_DEVICE = """
        def naive_allreduce(arrays):
            n = len(arrays)
            total = np.array(arrays[0], copy=True)
            for a in arrays[1:]:
                total = total + a
            return [total] * n, [(n - 1) * arrays[0].nbytes] + [arrays[0].nbytes] * (n - 1)
"""

# (chapter, set, name, the tests (names or prefixes of parametrized ones), code, why)
MUTANTS = [
    # -- 01 -----------------------------------------------------------------------------
    ("01-tensors-and-devices", 1, "broadcast-by-numpy",
     ["test_broadcast_shape_matches_minigraph"], """
        def broadcast_shape(a, b):
            return tuple(np.broadcast_shapes(a, b))
     """, FORBIDDEN),
    ("01-tensors-and-devices", 1, "sum-to-by-minigraph", ["test_sum_to_matches_minigraph"], """
        def sum_to(g, shape):
            return mg.sum_to(mg.tensor(g), shape).numpy()
     """, FORBIDDEN),
    ("01-tensors-and-devices", 1, "promotion-by-numpy", ["test_result_dtype_of_two_tensors"], """
        def result_dtype(a, b):
            return str(np.result_type(a, b))
     """, FORBIDDEN),
    ("01-tensors-and-devices", 1, "nbytes-of-a-numpy-array",
     ["test_tensor_nbytes_matches_device_accounting"], """
        def tensor_nbytes(shape, dtype):
            return np.zeros(shape, dtype).nbytes
     """, FORBIDDEN),
    ("01-tensors-and-devices", 1, "elements-not-bytes", ["test_bytes_per_device_matches_live_bytes"], """
        def bytes_per_device(tensors):
            total = {}
            for t in tensors:
                total[t.device.name] = total.get(t.device.name, 0) + int(np.prod(t.shape))
            return total
     """, "AssertionError"),
    ("01-tensors-and-devices", 1, "timer-without-synchronize", ["test_gpu_time_waits_for_the_queue"], """
        def gpu_time(work, synchronize, clock=time.perf_counter):
            start = clock()
            work()
            return clock() - start
     """, "AssertionError"),
    ("01-tensors-and-devices", 2, "timer-returning-an-empty-array",
     ["test_gpu_time_waits_for_the_queue"], """
        def gpu_time(work, synchronize, clock=time.perf_counter):
            work()
            return np.empty(0)     # pytest.approx took it for equal to any number
     """, "gpu_time returns a number of seconds"),
    # every device listed, those holding none of the tensors with 0 bytes: the exercise
    # lists only the devices that hold one
    ("01-tensors-and-devices", 2, "every-device-listed", ["test_bytes_per_device_matches_live_bytes"], """
        import math
        def bytes_per_device(tensors):
            total = {name: 0 for name in mg.devices() if name.startswith("cpu")}
            for t in tensors:
                total[t.device.name] += math.prod(t.shape) * ITEMSIZE[t.dtype]
            return total
     """, "bytes per device"),
    # -- 02 -----------------------------------------------------------------------------
    ("02-automatic-differentiation", 1, "product-rule-forgotten", ["test_dual_add_and_mul_match_jvp"], """
        class Dual:
            def __init__(self, value, tangent=0.0):
                self.value, self.tangent = float(value), float(tangent)
            def __add__(self, other):
                other = other if isinstance(other, Dual) else Dual(other)
                return Dual(self.value + other.value, self.tangent + other.tangent)
            def __mul__(self, other):
                other = other if isinstance(other, Dual) else Dual(other)
                return Dual(self.value * other.value, self.tangent * other.tangent)
            __radd__, __rmul__ = __add__, __mul__
            def __neg__(self):
                return Dual(-self.value, -self.tangent)
            def __sub__(self, other):
                return self + (-other if isinstance(other, Dual) else Dual(-other))
            def __rsub__(self, other):
                return Dual(other) - self
     """, "AssertionError"),
    ("02-automatic-differentiation", 1, "sin-by-jvp", ["test_dual_functions_match_jvp[sin]"], """
        def sin(x):
            out, tangent = mg.jvp(mg.sin, (x.value,), (x.tangent,))
            return Dual(out.item(), tangent.item())
     """, FORBIDDEN),
    ("02-automatic-differentiation", 1, "cos-with-the-wrong-sign", ["test_dual_functions_match_jvp[cos]"], """
        import math
        def cos(x):
            return Dual(math.cos(x.value), math.sin(x.value) * x.tangent)
     """, "AssertionError"),
    ("02-automatic-differentiation", 1, "exp-by-jvp", ["test_dual_functions_match_jvp[exp]"], """
        def exp(x):
            out, tangent = mg.jvp(mg.exp, (x.value,), (x.tangent,))
            return Dual(out.item(), tangent.item())
     """, FORBIDDEN),
    ("02-automatic-differentiation", 1, "forward-gradient-by-grad",
     ["test_forward_gradient_textbook", "test_forward_gradient_random_programs_n_passes"], """
        def forward_gradient(f, xs):
            grads = mg.grad(f, argnums=tuple(range(len(xs))))(*xs)
            return [float(g) for g in grads]
     """, ""),
    ("02-automatic-differentiation", 1, "adjoints-overwritten-not-added",
     ["test_reverse_sweep_textbook", "test_reverse_sweep_random_tapes"], """
        import math
        def reverse_sweep(tape, values, output):
            g = {output: 1.0}
            for op, inputs, out in reversed(tape):
                a = g.get(out, 0.0)
                v = [values[i] for i in inputs]
                shares = {"add": lambda: [a, a], "sub": lambda: [a, -a],
                          "mul": lambda: [a * v[1], a * v[0]],
                          "sin": lambda: [a * math.cos(v[0])],
                          "cos": lambda: [-a * math.sin(v[0])],
                          "exp": lambda: [a * math.exp(v[0])]}[op]()
                for i, share in zip(inputs, shares):
                    g[i] = share          # should be g[i] = g.get(i, 0) + share
            return g
     """, "AssertionError"),
    ("02-automatic-differentiation", 1, "jacfwd-from-the-library", ["test_jacobian_fwd_by_columns"], """
        def jacobian_fwd(f, x):
            return mg.jacfwd(f)(x).numpy()
     """, FORBIDDEN),
    ("02-automatic-differentiation", 1, "jacrev-from-the-library", ["test_jacobian_rev_by_rows"], """
        def jacobian_rev(f, x):
            return mg.jacrev(f)(x).numpy()
     """, FORBIDDEN),
    # the output argument ignored: the sweep always starts from the tape's last record
    ("02-automatic-differentiation", 2, "sweep-from-the-last-record",
     ["test_reverse_sweep_textbook", "test_reverse_sweep_random_tapes"], """
        # reference: reverse_sweep as reference_reverse_sweep
        def reverse_sweep(tape, values, output):
            return reference_reverse_sweep(tape, values, tape[-1][2])
     """, "output"),
    # the tangents by mg.grad, a reverse-mode transform, where the forward ones are refused
    ("02-automatic-differentiation", 2, "tangents-by-grad", ["test_dual_functions_match_jvp"], """
        import math
        def sin(x):
            if isinstance(x, Dual):
                return Dual(math.sin(x.value), mg.grad(mg.sin)(x.value).item() * x.tangent)
            return math.sin(x)
        def cos(x):
            if isinstance(x, Dual):
                return Dual(math.cos(x.value), mg.grad(mg.cos)(x.value).item() * x.tangent)
            return math.cos(x)
        def exp(x):
            if isinstance(x, Dual):
                return Dual(math.exp(x.value), mg.grad(mg.exp)(x.value).item() * x.tangent)
            return math.exp(x)
     """, FORBIDDEN),
    # -- 03 -----------------------------------------------------------------------------
    ("03-ad-on-dataflow-graphs", 1, "sum-to-by-minigraph", ["test_sum_to"], """
        def sum_to(g, shape):
            return mg.sum_to(mg.tensor(g), tuple(shape)).numpy()
     """, FORBIDDEN),
    ("03-ad-on-dataflow-graphs", 1, "vjp-without-summing", ["test_vjp_mul_broadcasting"], """
        def vjp_mul(g, x, y):
            return g * y, g * x           # the broadcast axes are not summed
     """, "got shapes"),
    ("03-ad-on-dataflow-graphs", 1, "rows-by-forward-mode", ["test_jacobian_by_rows"], """
        def jacobian_by_rows(f, x):
            n = x.shape[0]
            columns = [mg.jvp(f, (x,), (np.eye(n)[j],))[1].numpy() for j in range(n)]
            return np.stack(columns, axis=1)
     """, "f ran"),
    # by columns, computed from rows of mg.vjp: right values, wrong number of passes
    ("03-ad-on-dataflow-graphs", 1, "columns-by-vjp-rows", ["test_jacobian_by_columns"], """
        def jacobian_by_columns(f, x):
            out, vjp = mg.vjp(f, x)
            rows = [vjp(mg.tensor(np.eye(out.size)[i]))[0].numpy() for i in range(out.size)]
            return np.stack(rows)
     """, "f ran 1 times"),
    # the right gradients, summed to one number each: assert_allclose alone would pass it
    ("03-ad-on-dataflow-graphs", 1, "scalar-gradient", ["test_reverse_sweep_random_graphs"], """
        # reference: reverse_sweep as reverse_sweep_solution
        def reverse_sweep(nodes, feeds, y):
            got = reverse_sweep_solution(nodes, feeds, y)
            return {x: None if g is None else np.float64(np.mean(g)) for x, g in got.items()}
     """, "the gradient for 'x': shape (), expected (4,)"),
    ("03-ad-on-dataflow-graphs", 1, "no-gradient-nodes",
     ["test_gradient_graph_textbook", "test_gradient_graph_random_graphs"], """
        def gradient_graph(nodes, y, xs):
            return [], list(xs)           # "the gradient of x is x"
     """, "AssertionError"),
    ("03-ad-on-dataflow-graphs", 1, "second-derivative-by-mg-grad", ["test_second_derivative"], """
        def second_derivative(nodes, y, x):
            mg.grad(mg.grad(mg.sin))(1.0)
            return [], None
     """, FORBIDDEN),
    # by rows with mg.jacrev where the exercise asks for columns by forward mode
    ("03-ad-on-dataflow-graphs", 2, "columns-by-jacrev", ["test_jacobian_by_columns"], """
        def jacobian_by_columns(f, x):
            return mg.jacrev(f)(x).numpy()
     """, FORBIDDEN),
    # y ignored: the sweep, and the gradient graph, always start from the last node
    ("03-ad-on-dataflow-graphs", 2, "sweep-from-the-last-node",
     ["test_reverse_sweep_textbook", "test_reverse_sweep_random_graphs"], """
        # reference: reverse_sweep as reference_reverse_sweep
        def reverse_sweep(nodes, feeds, y):
            return reference_reverse_sweep(nodes, feeds, nodes[-1][0])
     """, "AssertionError"),
    ("03-ad-on-dataflow-graphs", 2, "gradient-graph-of-the-last-node",
     ["test_gradient_graph_textbook", "test_gradient_graph_random_graphs"], """
        # reference: gradient_graph as reference_gradient_graph
        def gradient_graph(nodes, y, xs):
            return reference_gradient_graph(nodes, nodes[-1][0], xs)
     """, "AssertionError"),
    # xs ignored: the gradient of every input, in the graph's order
    ("03-ad-on-dataflow-graphs", 3, "gradients-of-every-input",
     ["test_gradient_graph_textbook", "test_gradient_graph_random_graphs"], """
        # reference: gradient_graph as reference_gradient_graph
        def gradient_graph(nodes, y, xs):
            every = [name for name, op, _ in nodes if op == "input"]
            return reference_gradient_graph(nodes, y, every)
     """, "expected one per x"),
    ("03-ad-on-dataflow-graphs", 3, "second-derivative-of-the-last-node", ["test_second_derivative"], """
        # reference: gradient_graph as reference_gradient_graph
        def second_derivative(nodes, y, x):
            first, (gx,) = reference_gradient_graph(nodes, nodes[-1][0], [x])
            if gx is None:
                return first, None
            second, (gxx,) = reference_gradient_graph(list(nodes) + first, gx, [x])
            return first + second, gxx
     """, "AssertionError"),
    # -- 04 -----------------------------------------------------------------------------
    ("04-define-and-run-vs-define-by-run", 1, "source-by-the-library",
     ["test_graph_to_source_computes_the_graph", "test_graph_to_source_is_straight_line_and_pruned"], """
        from minigraph.graph.compile import compile_graph
        def graph_to_source(nodes, inputs, outputs, name="f"):
            return compile_graph(nodes).source
     """, FORBIDDEN),
    ("04-define-and-run-vs-define-by-run", 1, "define-from-the-library", ["test_compile_source"], """
        from minigraph.graph.compile import define
        def compile_source(source, name):
            return define(source, name)
     """, FORBIDDEN),
    ("04-define-and-run-vs-define-by-run", 1, "signature-from-the-library", ["test_signature_matches_minigraph"], """
        from minigraph.graph.trace import signature as _signature
        def signature(args):
            return _signature(args)
     """, FORBIDDEN),
    ("04-define-and-run-vs-define-by-run", 1, "hybrid-without-a-cache", ["test_hybrid_records_once_per_signature"], """
        class Hybrid:
            def __init__(self, f):
                self.f = f
            def __call__(self, *args):
                return self.f(*args)      # runs eagerly every time: nothing is recorded
     """, ""),
    ("04-define-and-run-vs-define-by-run", 1, "cse-by-the-library", ["test_cse_matches_minigraph"], """
        from minigraph.graph.passes import cse as _cse
        def cse(nodes, outputs):
            return _cse(nodes, outputs)
     """, FORBIDDEN),
    # the parameters in the graph's order of its input nodes, not in the order of inputs
    ("04-define-and-run-vs-define-by-run", 2, "parameters-in-graph-order",
     ["test_graph_to_source_computes_the_graph", "test_graph_to_source_is_straight_line_and_pruned"], """
        # reference: graph_to_source as reference_graph_to_source
        def graph_to_source(nodes, inputs, outputs, name="f"):
            ordered = [n for n, op, _ in nodes if op == "input" and n in inputs]
            return reference_graph_to_source(nodes, ordered, outputs, name)
     """, "AssertionError"),
    # a string by its type only: f(x, "relu") would replay the graph recorded for "tanh"
    ("04-define-and-run-vs-define-by-run", 2, "string-by-its-type", ["test_signature_matches_minigraph"], """
        # reference: signature as reference_signature
        def signature(args):
            return reference_signature(tuple("a string" if isinstance(a, str) else a
                                             for a in args))
     """, "should have different signatures"),
    # a list keyed as a tuple of the same items
    ("04-define-and-run-vs-define-by-run", 3, "list-as-a-tuple", ["test_signature_matches_minigraph"], """
        # reference: signature as reference_signature
        def signature(args):
            def as_tuples(a):
                return tuple(as_tuples(i) for i in a) if isinstance(a, (list, tuple)) else a
            return reference_signature(tuple(as_tuples(a) for a in args))
     """, "should have different signatures"),
    # -- 05 -----------------------------------------------------------------------------
    # Kahn's algorithm with a stack: a topological order, not the FIFO one
    ("05-scheduling-and-memory", 1, "lifo-not-fifo",
     ["test_fifo_order_of_the_textbook_example", "test_fifo_order_of_random_graphs"], """
        def fifo_order(names, inputs):
            missing = {n: len(inputs[n]) for n in names}
            ready, order = [n for n in names if missing[n] == 0], []
            while ready:
                n = ready.pop()
                order.append(n)
                for c in names:
                    for i in inputs[c]:
                        if i == n:
                            missing[c] -= 1
                            if missing[c] == 0:
                                ready.append(c)
            if len(order) != len(names):
                raise ValueError("cycle")
            return order
     """, "AssertionError"),
    ("05-scheduling-and-memory", 1, "x-times-x-read-twice", ["test_free_after_matches_reference_counting"], """
        def free_after(order, inputs, fetches, external):
            readers = {n: 0 for n in order}
            for n in order:
                for i in inputs[n]:       # not set(inputs[n]): x * x counts x twice
                    readers[i] += 1
            freed, keep = {n: None for n in order}, set(fetches) | set(external)
            for n in order:
                for i in set(inputs[n]):
                    readers[i] -= 1
                    if readers[i] == 0 and i not in keep:
                        freed[i] = n
                if readers[n] == 0 and n not in keep:
                    freed[n] = n
            return freed
     """, "AssertionError"),
    ("05-scheduling-and-memory", 1, "nothing-is-ever-freed", ["test_liveness_lower_bound_matches_the_session"], """
        def liveness_lower_bound(order, inputs, nbytes, fetches, external):
            return sum(nbytes[n] for n in order if n not in external)
     """, "AssertionError"),
    ("05-scheduling-and-memory", 1, "size-before-the-table", ["test_cost_class_matches_static_cost"], """
        def cost_class(op, shape, table_cost):
            if shape is not None and int(np.prod(shape)) >= LARGE_ELEMENTS:
                return "expensive"
            return table_cost or "cheap"
     """, "AssertionError"),
    ("05-scheduling-and-memory", 1, "everything-expensive-to-the-pool", ["test_dispatch_follows_tensorflows_rule"], """
        def dispatch(ready, cost, inline):
            queue = list(inline or []) + [n for n in ready if cost[n] == "cheap"]
            return queue, [[n] for n in ready if cost[n] != "cheap"]
     """, "AssertionError"),
    # -- 06 -----------------------------------------------------------------------------
    ("06-multi-device-execution", 1, "key-from-the-library", ["test_make_key_and_transfers"], """
        from minigraph.runtime.rendezvous import make_key as _make_key
        def make_key(send_device, recv_device, tensor_name):
            return _make_key(send_device, recv_device, tensor_name)
     """, FORBIDDEN),
    ("06-multi-device-execution", 1, "no-send-and-recv",
     ["test_partition_of_a_two_device_graph", "test_partition_matches_mg_partition"], """
        def partition(order, inputs, device):
            parts = {}
            for n in order:
                parts.setdefault(device[n], []).append((n, list(inputs[n])))
            return parts
     """, ""),
    # a value read by two nodes of a device crosses twice, and the keys are not sorted
    ("06-multi-device-execution", 2, "one-transfer-per-edge", ["test_make_key_and_transfers"], """
        # reference: make_key
        def transfers(inputs, device):
            return [make_key(device[p], device[c], p) for c, names in inputs.items()
                    for p in names if device[p] != device[c]]
     """, "AssertionError"),
    ("06-multi-device-execution", 1, "everything-on-one-device", ["test_greedy_place_matches_auto_place"], """
        def greedy_place(order, inputs, placed, seconds, nbytes, devices, bandwidth):
            return {n: placed.get(n, devices[0]) for n in order}
     """, ""),
    ("06-multi-device-execution", 1, "rendezvous-from-the-library", ["test_rendezvous_behaves_like_minigraphs"], """
        from minigraph.runtime.rendezvous import Rendezvous
     """, FORBIDDEN),
    # -- 07 -----------------------------------------------------------------------------
    ("07-data-and-model-parallelism", 1, "bounds-by-array-split", ["test_scatter_bounds_match_scatter"], """
        def scatter_bounds(n, parts):
            sizes = [len(p) for p in np.array_split(np.arange(n), parts)]
            return [int(b) for b in np.cumsum([0] + sizes)]
     """, FORBIDDEN),
    # the right sums, but every device sends its whole array to every other one
    ("07-data-and-model-parallelism", 1, "all-to-all-bytes", ["test_naive_allreduce_matches_minigraph"], """
        def naive_allreduce(arrays):
            n, total = len(arrays), sum(np.asarray(a) for a in arrays)
            size = np.asarray(arrays[0]).nbytes
            return [total.copy() for _ in range(n)], [(n - 1) * size] * n
     """, "AssertionError"),
    ("07-data-and-model-parallelism", 1, "whole-arrays-around-the-ring",
     ["test_ring_reduce_scatter_leaves_one_complete_chunk_per_device"], """
        def ring_reduce_scatter(chunks):
            n = len(chunks)
            total = [sum(chunks[d][c] for d in range(n)) for c in range(n)]
            sent = [sum(c.nbytes for c in chunks[d]) for d in range(n)]   # everything, not n - 1 chunks
            return [[t.copy() for t in total] for _ in range(n)], sent
     """, "bytes sent per device"),
    ("07-data-and-model-parallelism", 1, "gather-without-the-ring", ["test_ring_all_gather_spreads_the_complete_chunks"], """
        def ring_all_gather(chunks):
            n = len(chunks)
            done = [[chunks[(c - 1) % n][c].copy() for c in range(n)] for _ in range(n)]
            return done, [chunks[i][(i + 1) % n].nbytes for i in range(n)]
     """, "AssertionError"),
    ("07-data-and-model-parallelism", 1, "naive-posing-as-ring", ["test_ring_allreduce_matches_allreduce_with_stats"], """
        def ring_allreduce(arrays):
            n, total = len(arrays), sum(np.asarray(a) for a in arrays)
            size = np.asarray(arrays[0]).nbytes
            return [total.copy() for _ in range(n)], [(n - 1) * size] + [size] * (n - 1)
     """, "bytes"),
    # the gradient of the whole batch copied to every device: the right numbers
    ("07-data-and-model-parallelism", 1, "whole-batch-on-every-device",
     ["test_data_parallel_gradient_matches_data_parallel_grads"], """
        def data_parallel_gradient(grad_fn, params, x, y, parts):
            grads = grad_fn(params, x, y)
            return [[np.array(g, copy=True) for g in grads] for _ in range(parts)]
     """, "grad_fn saw batches"),
    # the N x C matrix the exercise forbids, built by joining the shards
    ("07-data-and-model-parallelism", 1, "shards-joined-into-n-by-c",
     ["test_parallel_cross_entropy_loss", "test_parallel_cross_entropy_gradients",
      "test_parallel_cross_entropy_is_stable_for_large_logits"], """
        def parallel_cross_entropy(shards, labels):
            z = np.concatenate(shards, axis=1)
            n = z.shape[0]
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            loss = float(np.mean(-np.log(p[np.arange(n), labels])))
            p[np.arange(n), labels] -= 1.0
            cuts = np.cumsum([0] + [s.shape[1] for s in shards])
            return loss, [p[:, a:b] / n for a, b in zip(cuts, cuts[1:])]
     """, FORBIDDEN),
    # the right loss and no gradients at all: the stability test zipped them with the
    # expected ones, and zip stopped at once
    # right values, but the rules the grader can only check in the sandbox (what crosses
    # to the grader is a fresh copy): one array for every device, inputs changed
    ("07-data-and-model-parallelism", 2, "one-sum-for-every-device",
     ["test_naive_allreduce_matches_minigraph"], ONE_SUM_FOR_EVERY_DEVICE,
     "two devices share one array"),
    # the same, and NumPy's verdict switched off in the sandbox, where the test's helper
    # asks it (the helper gets NumPy's names as they were before exercises.py ran)
    ("07-data-and-model-parallelism", 3, "one-sum-and-numpy-patched",
     ["test_naive_allreduce_matches_minigraph"], """
        np.shares_memory = lambda *args, **kwargs: False
        np.array_equal = lambda *args, **kwargs: True
     """ + ONE_SUM_FOR_EVERY_DEVICE, "two devices share one array"),
    ("07-data-and-model-parallelism", 2, "reduce-scatter-in-place",
     ["test_ring_reduce_scatter_leaves_one_complete_chunk_per_device"], """
        def ring_reduce_scatter(chunks):
            n = len(chunks)
            sent = [0] * n
            for t in range(n - 1):
                moves = [(i, (i - t) % n) for i in range(n)]
                pieces = [chunks[i][c].copy() for i, c in moves]
                for (i, c), piece in zip(moves, pieces):
                    chunks[(i + 1) % n][c] += piece
                    sent[i] += piece.nbytes
            return chunks, sent
     """, "changed its input arrays"),
    ("07-data-and-model-parallelism", 2, "loss-without-gradients",
     ["test_parallel_cross_entropy_gradients",
      "test_parallel_cross_entropy_is_stable_for_large_logits"], """
        # reference: parallel_cross_entropy as reference_parallel_cross_entropy
        def parallel_cross_entropy(shards, labels):
            loss, _ = reference_parallel_cross_entropy(shards, labels)
            return loss, []
     """, "AssertionError"),
    # -- 08 -----------------------------------------------------------------------------
    ("08-pipeline-parallelism", 1, "gpipe-from-the-library", ["test_gpipe_schedule"], """
        from minigraph.parallel import pipeline as pp
        def gpipe_schedule(stages, microbatches):
            return pp.schedule("gpipe", stages, microbatches)
     """, FORBIDDEN),
    ("08-pipeline-parallelism", 1, "1f1b-that-is-gpipe", ["test_one_f_one_b_schedule"], """
        def one_f_one_b_schedule(stages, microbatches):
            return [[("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)]
                    for _ in range(stages)]
     """, "AssertionError"),
    ("08-pipeline-parallelism", 1, "forwards-only", ["test_peak_activations"], """
        def peak_activations(ops):
            return sum(1 for op in ops if op[0] == "F")     # activations never freed
     """, "AssertionError"),
    ("08-pipeline-parallelism", 1, "bubble-over-microbatches-only", ["test_bubble_fraction"], """
        def bubble_fraction(stages, microbatches):
            return (stages - 1) / microbatches
     """, "AssertionError"),
    ("08-pipeline-parallelism", 2, "peak-from-the-library", ["test_peak_activations"], """
        from minigraph.parallel import pipeline as pp
        def peak_activations(ops):
            return pp.peak_in_flight(ops)
     """, FORBIDDEN),
    ("08-pipeline-parallelism", 2, "bubble-from-the-library", ["test_bubble_fraction"], """
        from minigraph.parallel import pipeline as pp
        def bubble_fraction(stages, microbatches):
            return pp.bubble_closed_form(stages, microbatches)
     """, FORBIDDEN),
    ("08-pipeline-parallelism", 1, "simulate-from-the-library",
     ["test_simulate_uniform_stages", "test_simulate_matches_pp_simulate"], """
        from minigraph.parallel import pipeline as pp
        def simulate(schedule, forward, backward):
            return pp.simulate(schedule, forward, backward)
     """, FORBIDDEN),
    ("08-pipeline-parallelism", 1, "makespan-as-a-sum", ["test_makespan_and_bubble"], """
        def makespan_and_bubble(timeline, stages):
            busy = sum(end - start for _, _, _, start, end in timeline)
            return busy, 0.0
     """, "AssertionError"),
    ("08-pipeline-parallelism", 1, "partition-from-the-library", ["test_partition_minimises_the_slowest_stage"], """
        from minigraph.parallel import pipeline as pp
        def partition(costs, stages):
            return pp.partition(costs, stages)
     """, FORBIDDEN),
    # -- 09 -----------------------------------------------------------------------------
    ("09-composing-transformations", 1, "mixed-partial-from-the-hessian",
     ["test_mixed_partial_textbook", "test_mixed_partial_closed_forms"], """
        def mixed_partial(f, x, y):
            return mg.hessian(f, argnums=(0, 1))(x, y)[0][1]
     """, FORBIDDEN),
    ("09-composing-transformations", 1, "hvp-from-the-hessian", ["test_hvp_closed_forms_one_pass", "test_hvp_keeps_float32"], """
        def hvp(f, x, v):
            return mg.hessian(f)(x) @ v
     """, FORBIDDEN),
    ("09-composing-transformations", 1, "mean-gradient-for-every-example",
     ["test_per_example_gradients_closed_forms[7-4]", "test_per_example_gradients_closed_forms[32-2]"], """
        def per_example_gradients(loss, w, X, Y):
            g = mg.grad(lambda w: sum(loss(w, X[b], Y[b]) for b in range(len(X))) / len(X))(w)
            return np.stack([np.asarray(g)] * len(X))
     """, ""),
    ("09-composing-transformations", 1, "jacobian-by-jacfwd", ["test_jacobian_batched_one_pass"], """
        def jacobian_batched(f, x):
            return mg.jacfwd(f)(x)
     """, FORBIDDEN),
    ("09-composing-transformations", 1, "mul-by-the-batch-rules", ["test_mul_batch_matches_a_loop"], """
        from minigraph.ops import batch_rules
        def mul_batch(dims, x, y):
            return batch_rules.elementwise(dims, x, y)
     """, FORBIDDEN),
    # -- later additions, 05-09: messages that say where, allocation, delegation -------
    # -- 05 -----------------------------------------------------------------------------
    # failure messages: the first differing item and what was expected, not only the graph
    ("05-scheduling-and-memory", 2, "lifo-told-where", ["test_fifo_order_of_random_graphs"], """
        def fifo_order(names, inputs):
            missing = {n: len(inputs[n]) for n in names}
            ready, order = [n for n in names if missing[n] == 0], []
            while ready:
                n = ready.pop()               # a stack, not a queue
                order.append(n)
                for c in names:
                    for i in inputs[c]:
                        if i == n:
                            missing[c] -= 1
                            if missing[c] == 0:
                                ready.append(c)
            if len(order) != len(names):
                raise ValueError("cycle")
            return order
     """, "order["),
    ("05-scheduling-and-memory", 2, "fetches-ignored-told-where",
     ["test_free_after_matches_reference_counting"], """
        def free_after(order, inputs, fetches, external):
            readers = {n: 0 for n in order}
            for n in order:
                for i in set(inputs[n]):
                    readers[i] += 1
            freed = {n: None for n in order}
            for n in order:
                for i in set(inputs[n]):
                    readers[i] -= 1
                    if readers[i] == 0 and i not in external:   # fetches freed too
                        freed[i] = n
                if readers[n] == 0 and n not in external:
                    freed[n] = n
            return freed
     """, "freed["),
    # -- 06 -----------------------------------------------------------------------------
    ("06-multi-device-execution", 2, "last-device-told-where", ["test_greedy_place_matches_auto_place"], """
        def greedy_place(order, inputs, placed, seconds, nbytes, devices, bandwidth):
            return {n: placed.get(n, devices[-1]) for n in order}
     """, "placed["),
    ("06-multi-device-execution", 2, "send-per-consumer-told-where",
     ["test_partition_matches_mg_partition"], """
        def partition(order, inputs, device):
            parts = {}
            for n in order:
                dst = device[n]
                for a in dict.fromkeys(inputs[n]):
                    if device[a] != dst:      # a Send/Recv pair per reader, not per device
                        key = f"{device[a]};{dst};{a}"
                        parts.setdefault(device[a], []).append(("Send", key))
                        parts.setdefault(dst, []).append(("Recv", key))
                parts.setdefault(dst, []).append(n)
            return parts
     """, "partition["),
    ("06-multi-device-execution", 3, "key-per-producer-told-where", ["test_make_key_and_transfers"], """
        # reference: make_key
        def transfers(inputs, device):
            keys = {}
            for c, names in inputs.items():
                for p in names:
                    if device[p] != device[c]:   # one key per producer, not per device
                        keys[p] = make_key(device[p], device[c], p)
            return sorted(keys.values())
     """, "transfers"),
    # -- 07 -----------------------------------------------------------------------------
    # bytes credited to the receiver: the sum and the maximum stay right
    ("07-data-and-model-parallelism", 2, "ring-bytes-on-the-receiver",
     ["test_ring_allreduce_matches_allreduce_with_stats"], """
        def ring_allreduce(arrays):
            n = len(arrays)
            shape = np.shape(arrays[0])
            flat = [np.array(a, copy=True).reshape(-1) for a in arrays]
            cuts = chunk_bounds(flat[0].size, n)
            ch = [[f[cuts[c]:cuts[c + 1]].copy() for c in range(n)] for f in flat]
            sent = [0] * n
            for t in range(n - 1):                       # reduce-scatter
                moves = [(i, (i - t) % n) for i in range(n)]
                pieces = [ch[i][c].copy() for i, c in moves]
                for (i, c), piece in zip(moves, pieces):
                    ch[(i + 1) % n][c] = ch[(i + 1) % n][c] + piece
                    sent[(i + 1) % n] += piece.nbytes    # the receiver's counter
            for t in range(n - 1):                       # all-gather
                moves = [(i, (i + 1 - t) % n) for i in range(n)]
                pieces = [ch[i][c].copy() for i, c in moves]
                for (i, c), piece in zip(moves, pieces):
                    ch[(i + 1) % n][c] = piece
                    sent[(i + 1) % n] += piece.nbytes    # the receiver's counter
            return [np.concatenate(d).reshape(shape) for d in ch], sent
     """, "bytes sent per device"),
    # the right sums, in one array handed to every device
    ("07-data-and-model-parallelism", 3, "ring-one-array-for-every-device",
     ["test_ring_allreduce_matches_allreduce_with_stats"], """
        # reference: ring_reduce_scatter as _reduce_scatter
        # reference: ring_all_gather as _all_gather
        def ring_allreduce(arrays):
            n = len(arrays)
            shape = np.shape(arrays[0])
            flat = [np.asarray(a).reshape(-1) for a in arrays]
            cuts = chunk_bounds(flat[0].size, n)
            chunks = [[f[cuts[c]:cuts[c + 1]] for c in range(n)] for f in flat]
            chunks, sent1 = _reduce_scatter(chunks)
            chunks, sent2 = _all_gather(chunks)
            total = np.concatenate(chunks[0]).reshape(shape)
            return [total] * n, [a + b for a, b in zip(sent1, sent2)]
     """, "two devices share one array"),
    # the N x C matrix built with np.zeros and slice assignment: no forbidden name
    ("07-data-and-model-parallelism", 3, "n-by-c-by-slice-assignment",
     ["test_parallel_cross_entropy_loss", "test_parallel_cross_entropy_gradients",
      "test_parallel_cross_entropy_is_stable_for_large_logits"], """
        def parallel_cross_entropy(shards, labels):
            n = shards[0].shape[0]
            widths = [s.shape[1] for s in shards]
            z = np.zeros((n, sum(widths)))
            at = 0
            for s in shards:
                z[:, at:at + s.shape[1]] = s
                at += s.shape[1]
            z = z - z.max(axis=1, keepdims=True)
            p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            loss = float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(n), labels]))
            p[np.arange(n), labels] -= 1.0
            grads, at = [], 0
            for w in widths:
                grads.append(p[:, at:at + w] / n)
                at += w
            return loss, grads
     """, "the whole N x C matrix takes"),
    # -- 08 -----------------------------------------------------------------------------
    ("08-pipeline-parallelism", 2, "gpipe-by-the-private-helper", ["test_gpipe_schedule"], """
        from minigraph.parallel.pipeline.scheduling import _gpipe
        def gpipe_schedule(stages, microbatches):
            return [_gpipe(stages, s, microbatches) for s in range(stages)]
     """, FORBIDDEN),
    ("08-pipeline-parallelism", 2, "1f1b-by-the-private-helper", ["test_one_f_one_b_schedule"], """
        from minigraph.parallel.pipeline.scheduling import _one_f_one_b
        def one_f_one_b_schedule(stages, microbatches):
            return [_one_f_one_b(stages, s, microbatches) for s in range(stages)]
     """, FORBIDDEN),
    ("08-pipeline-parallelism", 3, "bubble-by-simulating", ["test_bubble_fraction"], """
        from minigraph.parallel import pipeline as pp
        def bubble_fraction(stages, microbatches):
            return pp.simulate(pp.schedule("gpipe", stages, microbatches)).bubble_fraction
     """, FORBIDDEN),
    # one pass after another, no overlap: the message names the first wrong event
    ("08-pipeline-parallelism", 2, "no-overlap-told-where",
     ["test_simulate_uniform_stages", "test_simulate_matches_pp_simulate"], """
        def simulate(schedule, forward, backward):
            events, t = [], 0.0
            for s, ops in enumerate(schedule):
                for kind, k in ops:
                    d = forward[s] if kind == "F" else backward[s]
                    events.append((s, kind, k, t, t + d))
                    t += d
            return sorted(events, key=lambda e: (e[3], e[0]))
     """, "(stage, kind, k, start, end)"),
    # -- 09 -----------------------------------------------------------------------------
    # rows of one mg.vjp, vmapped: right values in one run of f, by reverse mode
    ("09-composing-transformations", 2, "jacobian-by-vjp-rows", ["test_jacobian_batched_one_pass"], """
        def jacobian_batched(f, x):
            out, vjp_fn = mg.vjp(f, x)
            eye = mg.tensor(np.eye(out.shape[0]), dtype=x.dtype)
            return mg.vmap(lambda e: vjp_fn(e)[0])(eye)
     """, FORBIDDEN),
    # reverse over reverse: right values in one run of f, where forward over reverse is asked
    ("09-composing-transformations", 2, "hvp-reverse-over-reverse",
     ["test_hvp_closed_forms_one_pass", "test_hvp_keeps_float32"], """
        def hvp(f, x, v):
            return mg.grad(lambda z: (mg.grad(f)(z) * v).sum())(x)
     """, "expected mg.grad's Box holding mg.jvp's Dual"),
]

# tests a mutant passes because it is right on their inputs (the mutants' own tests
# are the others): a scalar gradient is right for the textbook's scalar inputs, and the
# mean gradient of one example is that example's gradient, a LIFO Kahn's algorithm finds
# cycles as well as a FIFO one
RIGHT_ON = {("03-ad-on-dataflow-graphs", "test_reverse_sweep_textbook"),
            ("05-scheduling-and-memory", "test_fifo_order_detects_a_cycle"),
            ("07-data-and-model-parallelism", "test_parallel_cross_entropy_loss"),
            ("09-composing-transformations", "test_per_example_gradients_closed_forms[1-3]")}

SETS = sorted({(chapter, number) for chapter, number, *_ in MUTANTS})


def submission(chapter: str, number: int) -> str:
    """The released chapter with the set's mutants appended. A line ``# reference: f``
    (or ``# reference: f as g``) in a mutant appends the reference solution of ``f``
    (named ``g``): a mutant may build on a right answer, or need one beside it."""
    source = (CHAPTERS / chapter / "exercises.py").read_text()
    codes = [textwrap.dedent(code) for c, n, _, _, code, _ in MUTANTS if (c, n) == (chapter, number)]
    parts = [strip_solutions(source), "\n\n# -- mutants --\nimport time\nimport numpy as np\n"
             "import minigraph as mg\n"]
    for code in codes:
        for match in re.finditer(r"^# reference: (\w+)(?: as (\w+))?$", code, re.M):
            parts.append(_renamed(source, match.group(1), match.group(2) or match.group(1)))
        parts.append(code)
    return "".join(parts)


def _renamed(source: str, name: str, new: str) -> str:
    """The function ``name`` of ``source`` (solution included), renamed ``new``."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = source.splitlines(keepends=True)[node.lineno - 1:node.end_lineno]
    return "\n\n" + "".join(lines).replace(f"def {name}(", f"def {new}(", 1) + "\n"


@pytest.fixture(scope="module")
def mutant_reports(tmp_path_factory):
    work = tmp_path_factory.mktemp("mutants")

    def run(key, text):
        chapter, number = key
        folder = work / f"set{number}" / chapter
        folder.mkdir(parents=True)
        (folder / "exercises.py").write_text(text)
        return grade(folder, timeout=30.0)

    # (the submissions are written here, in one thread: their text is read with ast,
    # which CPython 3.11 cannot run in two threads at once; the gradings overlap)
    submissions = {key: submission(*key) for key in SETS}
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {key: pool.submit(run, key, submissions[key]) for key in SETS}
        return {key: f.result() for key, f in futures.items()}


def test_every_exercise_has_a_mutant():
    for chapter in sorted(p.parent.name for p in CHAPTERS.glob("*/exercises.py")):
        owners = {r.owner.split(".")[0] for r in
                  solution_regions((CHAPTERS / chapter / "exercises.py").read_text())}
        mutated = set()
        for c, _, _, _, code, _ in MUTANTS:
            if c == chapter:
                mutated |= {line.split()[1].split("(")[0].rstrip(":") for line in
                            textwrap.dedent(code).splitlines()
                            if line.startswith(("def ", "class "))}
                mutated |= {w.strip(",") for line in textwrap.dedent(code).splitlines()
                            if line.startswith("from ") for w in line.split()[3:]}
        assert owners <= mutated, f"{chapter}: no mutant for {sorted(owners - mutated)}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[f"{m[0][:2]}-{m[2]}" for m in MUTANTS])
def test_the_exercise_fails_the_mutant(mutant_reports, mutant):
    chapter, number, _, tests, _, why = mutant
    report = mutant_reports[chapter, number]
    results = [r for r in report.results
               if any(r.name == t or r.name.startswith(t + "[") for t in tests)]
    assert results, f"no test named {tests} in {chapter}"
    for result in results:
        assert result.status == "failed", report.table(width=200)
        assert why in result.output, f"{result.name}: {result.output}"


@pytest.mark.parametrize("key", SETS, ids=[f"{c[:2]}-set{n}" for c, n in SETS])
def test_a_set_of_mutants_scores_zero(mutant_reports, key):
    """No test passes without a right answer (the stubs and mutants are all wrong, but
    for RIGHT_ON), and every test ran: nothing in the submission broke the grader."""
    report = mutant_reports[key]
    passed = {(key[0], r.name) for r in report.results if r.status == "passed"}
    assert report.results and passed <= RIGHT_ON, report.table(width=200)
    assert not report.notes, report.table(width=200)


# -- a submission that refuses everything -------------------------------------------------

CHAPTER_NAMES = sorted(p.parent.name for p in CHAPTERS.glob("*/exercises.py"))


def refuse_everything(chapter: str) -> str:
    """The released chapter with every stub raising ValueError instead of
    NotImplementedError: the refusal a test checks with ``pytest.raises(ValueError)``,
    given everywhere."""
    stubs = strip_solutions((CHAPTERS / chapter / "exercises.py").read_text())
    return stubs.replace("raise NotImplementedError(", "raise ValueError(")


@pytest.fixture(scope="module")
def refusing_reports(tmp_path_factory):
    work = tmp_path_factory.mktemp("refusing")
    submissions = {chapter: refuse_everything(chapter) for chapter in CHAPTER_NAMES}

    def run(chapter):
        folder = work / chapter
        folder.mkdir()
        (folder / "exercises.py").write_text(submissions[chapter])
        return grade(folder, timeout=30.0)

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {chapter: pool.submit(run, chapter) for chapter in CHAPTER_NAMES}
        return {chapter: f.result() for chapter, f in futures.items()}


@pytest.mark.parametrize("chapter", CHAPTER_NAMES, ids=[c[:2] for c in CHAPTER_NAMES])
def test_refusing_everything_scores_zero(refusing_reports, chapter):
    """A test that only checks a refusal (``pytest.raises(ValueError)``) gave its points
    to a submission whose every function raises ValueError: chapters 01 and 05 did. Each
    such test must check a right answer too."""
    report = refusing_reports[chapter]
    assert report.results and report.score == 0, report.table(width=200)
