"""Chapter 06, multi-device execution: the exercises.

Write each function below where it says ``raise NotImplementedError``; then run

    minigraph grade chapters/06-multi-device-execution

The graphs come to you as plain Python data:

* ``order``: the node names in an order where every node comes after its inputs;
* ``inputs``: ``{name: [names of its inputs, in argument order]}`` (``x * x`` lists
  ``x`` twice; roots have ``[]``);
* ``device``: ``{name: device name}``, e.g. ``"cpu"``, ``"cpu:1"``.

The tests build random graphs with minigraph, hand you the same graphs as plain data,
and compare what you return with ``mg.partition``, ``mg.auto_place`` and minigraph's
rendezvous (``minigraph/runtime/rendezvous.py``).
"""


def make_key(send_device, recv_device, tensor_name):
    """The rendezvous key of one transfer: ``"send_device;recv_device;tensor_name"``.

    >>> make_key("cpu", "cpu:1", "x")
    'cpu;cpu:1;x'
    """
    ### BEGIN SOLUTION
    return f"{send_device};{recv_device};{tensor_name}"
    ### END SOLUTION


def transfers(inputs, device):
    """The keys of the transfers a partition needs, sorted.

    Every edge from a node on device A to a node on device B (A != B) needs the value to
    cross from A to B; a value read by several nodes of B (or twice by one) crosses to B
    once. Return the sorted list of the distinct keys ``make_key(A, B, producer)``.
    """
    ### BEGIN SOLUTION
    keys = set()
    for consumer, names in inputs.items():
        for producer in names:
            if device[producer] != device[consumer]:
                keys.add(make_key(device[producer], device[consumer], producer))
    return sorted(keys)
    ### END SOLUTION


def partition(order, inputs, device):
    """Cut the graph into one list of nodes per device, with Send/Recv pairs.

    Visit the nodes in ``order``. For each node ``n`` on device B, first look at its
    inputs in argument order: an input ``a`` on another device A that has not yet been
    sent to B gets a pair: append ``("Send", key)`` to A's list and ``("Recv", key)`` to
    B's list, where ``key = make_key(A, B, a)``. Then append ``n`` (its name) to B's list.

    Returns ``{device name: [entries]}`` for every device that holds at least one entry,
    each list in the order the entries were appended. A consumer on B then reads the
    Recv in place of ``a``: no node ever reads a value of another device directly.
    """
    ### BEGIN SOLUTION
    parts = {}
    sent = set()
    for n in order:
        dst = device[n]
        for a in inputs[n]:
            src = device[a]
            if src != dst and (a, dst) not in sent:
                sent.add((a, dst))
                key = make_key(src, dst, a)
                parts.setdefault(src, []).append(("Send", key))
                parts.setdefault(dst, []).append(("Recv", key))
        parts.setdefault(dst, []).append(n)
    return parts
    ### END SOLUTION


def greedy_place(order, inputs, placed, seconds, nbytes, devices, bandwidth):
    """The greedy placer of ``mg.auto_place``: each node where it would finish first.

    ``order``: the nodes in creation order; ``placed``: ``{name: device}`` for the nodes
    that compute nothing (placeholders, constants, variables): they stay where they are
    and their value is there at time 0; ``seconds``: ``{name: estimated run time}`` for
    the other nodes; ``nbytes``: ``{name: bytes of its value}``; ``devices``: the
    devices to choose from, in order; ``bandwidth``: bytes per second between devices.

    Keep, for every device, the time it becomes free (0 at first), and for every node
    the time it finishes. For each computing node, in ``order``, and each device ``d``:

        an input i arrives at d at   finish[i]                        if i is on d,
                                     finish[i] + nbytes[i] / bandwidth otherwise;
        ready  = the latest arrival of its inputs (0.0 if it has none);
        finish = max(ready, free[d]) + seconds[n].

    Choose the device with the smallest finish (the first one in ``devices`` on a
    tie), record the node's finish, and make that device free at that time.

    Returns ``{name: device}`` for every node in ``order``.
    """
    ### BEGIN SOLUTION
    free = {d: 0.0 for d in devices}
    finish = {}
    where = {}
    for n in order:
        if n in placed:
            where[n], finish[n] = placed[n], 0.0
            continue
        best = None
        for d in devices:
            ready = 0.0
            for i in inputs[n]:
                arrive = finish[i]
                if where[i] != d:
                    arrive += nbytes[i] / bandwidth
                ready = max(ready, arrive)
            end = max(ready, free[d]) + seconds[n]
            if best is None or end < best[1]:
                best = (d, end)
        where[n], finish[n] = best
        free[best[0]] = best[1]
    return where
    ### END SOLUTION


class Rendezvous:
    """Where a Send leaves a tensor and the matching Recv picks it up.

    * ``send(key, value)``: store ``value`` under ``key``, then call the callbacks of
      the Recvs already waiting for ``key`` with ``(value, None)``, in the order they
      asked, and forget them. Sending a key twice raises ``RuntimeError``.
    * ``recv(key, callback)``: never blocks. If the rendezvous has been aborted, call
      ``callback(None, error)`` at once; else if ``key`` has arrived, call
      ``callback(value, None)`` at once; else keep the callback until it does.
    * ``abort(error)``: remember ``error`` (only the first abort's error counts), and
      call every waiting callback with ``(None, that first error)``, forgetting them.
      Sends still store their values after an abort.
    """

    def __init__(self):
        ### BEGIN SOLUTION
        self.values = {}
        self.waiting = {}
        self.error = None
        ### END SOLUTION

    def send(self, key, value):
        ### BEGIN SOLUTION
        if key in self.values:
            raise RuntimeError(f"rendezvous: {key!r} was sent twice")
        self.values[key] = value
        for callback in self.waiting.pop(key, []):
            callback(value, None)
        ### END SOLUTION

    def recv(self, key, callback):
        ### BEGIN SOLUTION
        if self.error is not None:
            callback(None, self.error)
        elif key in self.values:
            callback(self.values[key], None)
        else:
            self.waiting.setdefault(key, []).append(callback)
        ### END SOLUTION

    def abort(self, error):
        ### BEGIN SOLUTION
        if self.error is None:
            self.error = error
        waiting = [cb for cbs in self.waiting.values() for cb in cbs]
        self.waiting = {}
        for callback in waiting:
            callback(None, self.error)
        ### END SOLUTION
