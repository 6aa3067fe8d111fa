"""Timelines and memory curves of a run (``sess.last_run``), labelled for reading.

``gantt`` draws one row per thread with every node's box labelled by its name where the
box is wide enough, the legend outside the rows; ``plot_memory`` draws live and held
memory in one unit (kB by default) with one colour per quantity, the same in every
panel, so that two runs drawn side by side read alike. ``device_rows`` orders device
names as a reader expects: cpu, cpu:1, cpu:2, ..., cpu:10 (not as strings sort).
"""

from __future__ import annotations

from typing import Any

COST_COLORS = {"cheap": "tab:green", "expensive": "tab:orange"}
MEMORY_COLORS = {"held": "tab:blue", "live": "tab:red"}
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def device_key(name: str) -> tuple[str, int]:
    """Sort key of a device name: its kind, then its index as a number."""
    kind, _, index = name.partition(":")
    return kind, int(index) if index.isdigit() else 0


def device_rows(names) -> list[str]:
    """Device names in reading order: cpu, cpu:1, cpu:2, ..., then other kinds."""
    return sorted(set(names), key=device_key)


def gantt(stats: Any, ax: Any = None, title: str | None = None, min_label_width: float = 0.04) -> Any:
    """A Gantt chart of ``stats`` (a ``RunStats``): one row per thread (0: the caller's),
    boxes coloured by cost class and labelled with the node's name when the box is at
    least ``min_label_width`` of the time axis. Returns the Axes."""
    from matplotlib.patches import Patch

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(10, 1 + 0.6 * len({e["tid"] for e in stats.events})))
    events = stats.events
    # (a run of no node, a rank's part of a run that has none, draws empty rows)
    t0 = min((e["ts"] for e in events), default=0.0)
    span = max((e["ts"] + e["dur"] for e in events), default=t0) - t0 or 1.0
    for e in events:
        start, dur = e["ts"] - t0, max(e["dur"], span * 0.002)
        ax.broken_barh([(start, dur)], (e["tid"] - 0.4, 0.8), facecolors=COST_COLORS[e["cost"]],
                       edgecolors="black", linewidth=0.3)
        if dur >= min_label_width * span:
            # (parse_math=False: a node's name as it is, never read as mathtext: $x_1$)
            ax.text(start + dur / 2, e["tid"], e["name"], ha="center", va="center", fontsize=7,
                    clip_on=True, parse_math=False)
    tids = sorted({e["tid"] for e in events}) or [0]
    ax.set_yticks(tids, [f"thread {t}" + (" (caller)" if t == 0 else "") for t in tids])
    ax.set_ylim(max(tids) + 0.6, min(tids) - 0.6)
    ax.set_xlabel("time since the first node started (µs)")
    ax.legend(handles=[Patch(facecolor=c, edgecolor="black", label=f"{k} node")
                       for k, c in COST_COLORS.items()],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def plot_memory(stats: Any, ax: Any = None, unit: str = "kB", title: str | None = None) -> Any:
    """Held (live values + pooled buffers) and live bytes over the run, per device, in
    ``unit``; held solid blue, live dashed red in every panel. Returns the Axes."""
    if unit not in UNITS:
        raise ValueError(f"plot_memory: unit is one of {list(UNITS)}, got {unit!r}")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(8, 3))
    scale = UNITS[unit]
    curve = stats.memory_curve
    # Every device of the run, one that allocated nothing too (a view of a feed, a
    # variable: its curve has no point), whose memory is then 0 from start to end.
    devices = device_rows([d for _, d, _, _ in curve] + list(stats.peak_bytes))
    t0 = min((t for t, _, _, _ in curve), default=0.0)
    end = max([t for t, _, _, _ in curve] + [(e["ts"] + e["dur"]) / 1e6 for e in stats.events],
              default=t0)
    for dev in devices:
        pts = [(t, live, held) for t, d, live, held in curve if d == dev]
        pts = pts or [(t0, 0, 0), (end, 0, 0)]
        suffix = f" on {dev}" if len(devices) > 1 else ""
        ax.step([(p[0] - t0) * 1e6 for p in pts], [p[2] / scale for p in pts], where="post",
                color=MEMORY_COLORS["held"], label=f"held (live + pool){suffix}")
        ax.step([(p[0] - t0) * 1e6 for p in pts], [p[1] / scale for p in pts], where="post",
                color=MEMORY_COLORS["live"], linestyle="--", label=f"live values{suffix}")
    ax.set_xlabel("time since the run started (µs)")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return ax
