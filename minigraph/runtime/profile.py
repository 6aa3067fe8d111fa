"""What a run did: its order, a trace event per node, its memory, and ways to see them.

``sess.last_run`` is a :class:`RunStats`:

* ``order``: node names in the order they started;
* ``events`` (a traced run only, ``mg.Session(g, trace=True)``; a run across devices is
  always traced, since its order comes from the events' clock): one complete event per
  node (``name``, ``ts`` and ``dur`` in microseconds,
  ``pid`` = device, ``tid`` = thread: 0 for the one that called ``run()`` (in a run
  across devices, the device's executor thread), even if it ran no node, then the
  pool's workers in the order they first finished a node, ``cost``; a Send's event
  also has ``handed``: the microseconds after its start at which its tensor went to
  the rendezvous, where the trace's arrow to the Recv starts);
* ``peak_bytes``: per device, the most bytes the run held at once (live values and the
  free buffers kept in the pool); ``lower_bound``: per device, the most bytes of *live*
  values at once, which no allocator can go below for this order; ``total_bytes``: the
  bytes of everything the run produced, what keeping every value would need;
* ``memory_curve`` (a traced run only): (seconds, device, live bytes, held bytes) after
  every change;
* ``bytes_moved``: ``{(from device, to device): bytes}`` that Send/Recv pairs copied,
  counted by each Send as it copies (the empty tensor of a control edge is not
  counted); ``bytes_sent`` and ``bytes_received`` add them up per device, the
  unit of the communication cost model (``minigraph/parallel/cost_model.py``). Across
  MPI ranks the device names carry their rank (``"rank:0/cpu"``), and
  ``bytes_across_ranks`` adds up the pairs whose ranks differ.

In a run across MPI ranks (``mpi_run.py``) every rank's ``last_run`` holds every rank's
events (each with its ``rank``, on one clock) and bytes, and the Chrome trace shows one
process per rank (pid = rank) and one row per device and thread.

``to_chrome_trace(path)`` writes the Trace Event Format (open it in https://ui.perfetto.dev
or chrome://tracing); ``gantt()`` draws the threads as rows with matplotlib.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import MinigraphError
from ..files import write_atomically


class TraceError(MinigraphError, ValueError):
    """The events or the memory curve of a run that was not traced."""


class RunStats:
    def __init__(self, order: list[str], events: list[dict] | None, peak_bytes: dict[str, int],
                 lower_bound: dict[str, int], total: dict[str, int],
                 memory_curve: list[tuple[float, str, int, int]] | None,
                 bytes_moved: dict[tuple[str, str], int] | None = None):
        self.order = order
        self.bytes_moved = dict(bytes_moved or {})
        self._events = events  # None: the run was not traced
        self.peak_bytes = peak_bytes
        self.lower_bound = lower_bound
        self.total_bytes_by_device = total
        self.total_bytes = sum(total.values())
        self._curve = memory_curve

    @property
    def traced(self) -> bool:
        """Whether the run recorded its events and memory curve (``Session(trace=True)``)."""
        return self._events is not None

    @property
    def events(self) -> list[dict]:
        """One complete event per node (a traced run only)."""
        if self._events is None:
            raise TraceError(self._untraced("events"))
        return self._events

    @property
    def memory_curve(self) -> list[tuple[float, str, int, int]]:
        """(seconds, device, live bytes, held bytes) after every change (a traced run only)."""
        if self._curve is None:
            raise TraceError(self._untraced("memory_curve"))
        return self._curve

    @staticmethod
    def _untraced(what: str) -> str:
        return (f"last_run.{what}: this run was not traced, so it recorded no timings; "
                f"create the session with mg.Session(graph, trace=True), or set "
                f"sess.trace = True before the run (tracing reads the clock twice per "
                f"node). The order, peak_bytes, lower_bound, total_bytes and bytes_moved "
                f"are kept for every run")

    @classmethod
    def merge(cls, runs: list) -> "RunStats":
        """The statistics of one step made of several device executors' runs."""
        traced = all(r.trace for r in runs)
        events = sorted((e for r in runs for e in r.events), key=lambda e: e["ts"])
        order = [e["name"] for e in events] if len(runs) > 1 else list(runs[0].order)
        moved: dict[tuple[str, str], int]  # (from device, to device) -> bytes
        peak, low, total, curve, moved = {}, {}, {}, [], {}
        for r in runs:
            peak.update(r.memory.peak_held)
            low.update(r.memory.peak_live)
            total.update(r.memory.total)
            curve += r.memory.curve
            for link, n in getattr(r, "moved", {}).items():
                moved[link] = moved.get(link, 0) + n
        if not traced:
            return cls(order, None, peak, low, total, None, moved)
        return cls(order, events, peak, low, total, sorted(curve), moved)

    @property
    def bytes_sent(self) -> dict[str, int]:
        """Bytes that Send/Recv pairs moved out of each device: ``{device: bytes}``."""
        return _per_device(self.bytes_moved, 0)

    @property
    def bytes_received(self) -> dict[str, int]:
        """Bytes that Send/Recv pairs moved into each device: ``{device: bytes}``."""
        return _per_device(self.bytes_moved, 1)

    @property
    def bytes_across_ranks(self) -> int:
        """Bytes that Send/Recv pairs moved from one MPI rank to another."""
        return sum(n for (a, b), n in self.bytes_moved.items() if _rank_of(a) != _rank_of(b))

    def __repr__(self) -> str:
        return (f"<RunStats: {len(self.order)} nodes, peak {self.peak_bytes} bytes, "
                f"total {self.total_bytes} bytes>")

    def chrome_trace(self) -> dict:
        """The run as a Trace Event Format object: one process per device, or, for a run
        across MPI ranks, one process per rank (pid = rank) and a row per device and
        thread."""
        if any("rank" in e for e in self.events):
            return self._chrome_trace_ranks()
        pids = {d: k for k, d in enumerate(sorted({e["pid"] for e in self.events}))}
        meta = [{"name": "process_name", "ph": "M", "pid": k, "args": {"name": d}}
                for d, k in pids.items()]
        where = {id(e): (pids[e["pid"]], e["tid"]) for e in self.events}
        return {"traceEvents": meta + self._slices(where), "displayTimeUnit": "ms"}

    def _chrome_trace_ranks(self) -> dict:
        rows = sorted({(e["rank"], e["pid"], e["tid"]) for e in self.events})
        tids = {row: k for k, row in enumerate(rows)}
        meta = [{"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}}
                for r in sorted({e["rank"] for e in self.events})]
        meta += [{"name": "thread_name", "ph": "M", "pid": r, "tid": tids[(r, d, t)],
                  "args": {"name": f"{d} thread {t}"}} for r, d, t in rows]
        where = {id(e): (e["rank"], tids[(e["rank"], e["pid"], e["tid"])]) for e in self.events}
        return {"traceEvents": meta + self._slices(where), "displayTimeUnit": "ms"}

    def _slices(self, where: dict[int, tuple[int, int]]) -> list[dict]:
        """A complete event per node, and an arrow from each Send to its Recv."""
        events = [{"name": e["name"], "cat": e["cost"], "ph": "X", "ts": e["ts"],
                   "dur": e["dur"], "pid": where[id(e)][0], "tid": where[id(e)][1],
                   "args": {"op": e["op"]}} for e in self.events]
        flows = []
        for e in (x for x in self.events if "key" in x):
            phase = {"Send": "s", "Recv": "f"}[e["op"]]
            # An arrow starts where the Send handed its tensor over (at its start if the
            # event does not say), not at the Send's end: the Recv may start before the
            # Send's thread reads the clock again, and the arrow would point back in time.
            at = e["ts"] + e.get("handed", 0.0) if phase == "s" else e["ts"]
            flows.append({"name": "transfer", "cat": "rendezvous", "ph": phase, "bp": "e",
                          "id": e["key"], "ts": at,
                          "pid": where[id(e)][0], "tid": where[id(e)][1]})
        return events + flows

    def to_chrome_trace(self, path: str) -> str:
        """Write ``chrome_trace()`` as JSON to ``path``; returns the path. A call that
        fails leaves an existing file as it was: the text is made first (an untraced run
        has no trace: TraceError), then written whole or not at all (``files.py``), as
        ``open`` writes it otherwise (through a link, keeping the file's mode)."""
        text = json.dumps(self.chrome_trace())
        write_atomically(path, lambda f: f.write(text.encode()))
        return path

    def gantt(self, ax: Any = None) -> Any:
        """A Gantt chart: one row per thread (row 0 the caller's), cheap and expensive nodes
        in two colours."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 1 + 0.5 * len({e["tid"] for e in self.events})))
        colors = {"cheap": "tab:green", "expensive": "tab:orange"}
        for e in self.events:
            ax.broken_barh([(e["ts"], max(e["dur"], 0.5))], (e["tid"] - 0.4, 0.8),
                           facecolors=colors[e["cost"]], edgecolors="black", linewidth=0.3)
        ax.set_xlabel("time (µs)")
        ax.set_ylabel("thread")
        ax.set_yticks(sorted({e["tid"] for e in self.events}))
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], loc="upper right")
        return ax

    def plot_memory(self, ax: Any = None) -> Any:
        """Live and held bytes over the run, per device."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3))
        for dev in sorted({d for _, d, _, _ in self.memory_curve}):
            pts = [(t, live, held) for t, d, live, held in self.memory_curve if d == dev]
            ax.step([p[0] * 1e6 for p in pts], [p[2] for p in pts], where="post",
                    label=f"{dev} held")
            ax.step([p[0] * 1e6 for p in pts], [p[1] for p in pts], where="post",
                    label=f"{dev} live", linestyle="--")
        ax.set_xlabel("time (µs)")
        ax.set_ylabel("bytes")
        ax.legend()
        return ax


def _rank_of(device: str) -> str:
    """``"rank:1"`` for ``"rank:1/cpu"``; ``""`` (this process) for an unprefixed name."""
    return device.split("/", 1)[0] if device.startswith("rank:") else ""


def _per_device(moved: dict[tuple[str, str], int], end: int) -> dict[str, int]:
    """``moved`` added up by source (``end=0``) or destination (``end=1``) device."""
    out: dict[str, int] = {}
    for link, n in moved.items():
        out[link[end]] = out.get(link[end], 0) + n
    return out
