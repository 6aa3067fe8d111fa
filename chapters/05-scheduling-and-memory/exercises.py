"""Chapter 05, scheduling and memory: the exercises.

Write each function below where it says ``raise NotImplementedError``; then run

    minigraph grade chapters/05-scheduling-and-memory

The graphs come to you as plain Python data, so that you write the algorithms without
minigraph's classes:

* ``names``: the node names in the order the nodes were created (a topological order:
  every node comes after its inputs);
* ``inputs``: ``{name: [names of its inputs, in argument order]}``; a node that reads
  one value twice (``x * x``) lists it twice; roots (placeholders) have ``[]``.

For z = x*y + sin(x):

    names  = ["x", "y", "mul", "sin", "add"]
    inputs = {"x": [], "y": [], "mul": ["x", "y"], "sin": ["x"], "add": ["mul", "sin"]}

The tests build random graphs with minigraph, hand you the same graphs as plain data,
and compare what you return with what minigraph's own runtime does.
"""

from collections import deque

# Ops the scheduler always runs inline, whatever their size (minigraph/runtime/cost.py).
ALWAYS_CHEAP = {"Placeholder", "Const", "Variable", "Assign", "reshape", "transpose",
                "broadcast_to", "getitem", "identity", "stop_gradient", "Send", "Recv"}
LARGE_ELEMENTS = 1 << 16  # an elementwise result with at least this many elements is expensive


def fifo_order(names, inputs):
    """Kahn's algorithm with a first-in first-out ready queue.

    Count, for every node, the inputs it still waits for (its in-degree; an input listed
    twice counts twice). The nodes that wait for nothing are ready: put them in a FIFO
    queue in creation order. Repeatedly take the node at the front, append it to the
    order, and lower the count of each of its consumers; a consumer whose count reaches
    zero joins the back of the queue. Consumers are visited in creation order.

    Returns the list of names in the order they run (what ``mg.Session(g, workers=1)``
    runs). Raises ``ValueError`` if some nodes never become ready (a cycle).

    >>> fifo_order(["x", "y", "mul", "sin", "add"],
    ...            {"x": [], "y": [], "mul": ["x", "y"], "sin": ["x"], "add": ["mul", "sin"]})
    ['x', 'y', 'sin', 'mul', 'add']
    """
    ### BEGIN SOLUTION
    missing = {n: len(inputs[n]) for n in names}
    consumers = {n: [] for n in names}
    for n in names:  # creation order, so every consumer list is in creation order
        for i in inputs[n]:
            consumers[i].append(n)
    ready = deque(n for n in names if missing[n] == 0)
    order = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for c in consumers[n]:
            missing[c] -= 1
            if missing[c] == 0:
                ready.append(c)
    if len(order) != len(names):
        stuck = [n for n in names if missing[n] > 0]
        raise ValueError(f"the graph has a cycle: {stuck} never become ready")
    return order
    ### END SOLUTION


def free_after(order, inputs, fetches, external):
    """When reference counting frees each value (SINGA's automatic recycling).

    ``order``: the names in the order they run; ``fetches``: the names whose values the
    caller asked for; ``external``: the names whose memory the run does not own (fed
    placeholders, constants, variables).

    Every value starts with a reference count: the number of *distinct* nodes of
    ``order`` that read it (``x * x`` reads ``x`` once). After a node runs, each of its
    distinct inputs loses one reference; a value whose count reaches zero is freed right
    then, after that node, unless it is fetched. A value that nobody reads and that is
    not fetched is freed right after the node that made it.

    Returns ``{name: the name of the node after which its value is freed}`` for every
    name in ``order``, with ``None`` for values the run never frees (fetched or external).
    """
    ### BEGIN SOLUTION
    readers = {n: 0 for n in order}
    for n in order:
        for i in set(inputs[n]):
            readers[i] += 1
    freed = {n: None for n in order}
    keep = set(fetches) | set(external)
    for n in order:
        for i in set(inputs[n]):
            readers[i] -= 1
            if readers[i] == 0 and i not in keep:
                freed[i] = n
        if readers[n] == 0 and n not in keep:
            freed[n] = n
    return freed
    ### END SOLUTION


def liveness_lower_bound(order, inputs, nbytes, fetches, external):
    """The peak of live bytes when the nodes run in ``order`` (the liveness lower bound).

    Walk ``order``: when a node runs, its result (``nbytes[name]`` bytes) becomes live,
    unless it is ``external`` (its memory is not the run's). Measure the live bytes at
    that moment, then free what reference counting frees after this node (the rule of
    ``free_after``). Return the largest measurement: no allocator can hold less than
    this for this order; minigraph reports it as ``sess.last_run.lower_bound``.
    """
    ### BEGIN SOLUTION
    readers = {n: 0 for n in order}
    for n in order:
        for i in set(inputs[n]):
            readers[i] += 1
    keep = set(fetches) | set(external)
    live = peak = 0
    for n in order:
        if n not in external:
            live += nbytes[n]
        peak = max(peak, live)
        for i in set(inputs[n]):
            readers[i] -= 1
            if readers[i] == 0 and i not in keep:
                live -= nbytes[i]
        if readers[n] == 0 and n not in keep:
            live -= nbytes[n]
    return peak
    ### END SOLUTION


def cost_class(op, shape, table_cost):
    """``"cheap"`` or ``"expensive"``: the scheduler's static class of a node.

    ``op``: the node's op name; ``shape``: its result's shape (a tuple, or ``None`` when
    unknown); ``table_cost``: the cost the primitive table gives the op (``"cheap"`` or
    ``"expensive"``), or ``None`` for a special node with no primitive (Placeholder,
    Const, Variable, Assign, Send, Recv).

    The rules, in this order: ops in ``ALWAYS_CHEAP`` and nodes with no primitive are
    cheap; ops the table marks expensive are expensive; a result of at least
    ``LARGE_ELEMENTS`` elements is expensive; everything else is cheap.
    """
    ### BEGIN SOLUTION
    if op in ALWAYS_CHEAP or table_cost is None:
        return "cheap"
    if table_cost == "expensive":
        return "expensive"
    if shape is not None:
        size = 1
        for s in shape:
            size *= s
        if size >= LARGE_ELEMENTS:
            return "expensive"
    return "cheap"
    ### END SOLUTION


def dispatch(ready, cost, inline):
    """TensorFlow's rule: who runs the nodes that have just become ready.

    ``ready``: names, in the order they became ready; ``cost``: ``{name: "cheap" or
    "expensive"}``; ``inline``: the names already queued to run on this thread after the
    node that just finished, or ``None`` when this thread is the one that starts the run
    (it runs the cheap roots and what they make ready, and computes nothing expensive).

    Returns ``(inline, batches)``: the thread's queue afterwards (for the starting
    thread, a new queue) and the list of batches handed to the thread pool, in order (a
    batch is a list of names that one pool thread runs one after the other).

    * Every thread: the cheap nodes join the end of its own queue, and every expensive
      node but the last goes to the pool as a batch of its own.
    * A worker thread keeps the last expensive node (it joins its queue) only if the
      queue is empty at that point; otherwise it too goes to the pool, since the thread
      has cheap work to do first.
    * The starting thread (``inline is None``) sends the last expensive node to the pool
      too: the pool's threads then start on the expensive work together.
    """
    ### BEGIN SOLUTION
    cheap = [n for n in ready if cost[n] == "cheap"]
    expensive = [n for n in ready if cost[n] != "cheap"]
    worker = inline is not None
    inline = (list(inline) if worker else []) + cheap
    keep_last = worker and expensive and not inline
    batches = [[n] for n in (expensive[:-1] if keep_last else expensive)]
    if keep_last:
        inline.append(expensive[-1])
    return inline, batches
    ### END SOLUTION
