"""Pipeline parallelism: profile, partition, schedule, simulate, and run for real [PipeDream].

A model too big (or too slow) for one device is cut into *stages* of consecutive layers,
one stage per device. A minibatch is cut into m *microbatches* that flow through the
stages like cars through an assembly line: while stage 1 works on microbatch 0, stage 0
already works on microbatch 1. Only activations (forwards) and their gradients
(backwards) cross between stages, never the weights, which is why a pipeline moves far
fewer bytes than data parallelism for many models.

PipeDream organises the work in four phases, and so does this package (one module each:
``profiling``, ``partitioning``, ``scheduling`` with ``simulation``, and ``execution``):

1. **Profile** (:func:`profile`). Run the model on one device and record, per layer i,
   its forward and backward compute time (together PipeDream's T_i), the size a_i of its
   output activation (also the size of the gradient coming back) and the size w_i of its
   parameters, in bytes. PipeDream relies on the fact that these barely change from one
   minibatch to the next (it profiles about a thousand minibatches in a few minutes); here
   each layer's fastest of 25 interleaved rounds, after a warm-up: other work on the
   machine only ever adds time to a timing, so the fastest round is the closest to the
   layer's own cost (:func:`fastest_runs` does the same for whole runs, to compare
   schedules). The profile is saved as JSON and as PipeDream's text form, one line per
   layer:
   ``node2 -- Linear(in_features=256, out_features=256, bias=True) --
   forward_compute_time=1.250, backward_compute_time=2.500, activation_size=524288.0,
   parameter_size=526336.000`` (milliseconds and bytes, on one line).
2. **Partition** (:func:`partition`, :func:`partition_pipedream`). In steady state a
   pipeline runs at the pace of its slowest stage, so the best cut into contiguous stages
   minimises the slowest stage's time. The problem has optimal substructure (the best
   pipeline for the first j layers ends with a best pipeline for fewer layers), so
   dynamic programming solves it exactly. PipeDream's version also lets a stage be
   *replicated* over several workers (data parallelism inside the stage, fed round-robin)
   and charges the communication: a_i / bandwidth for the activations crossing a cut, and
   the weight synchronisation of a replicated stage.
3. **Model transformation**. PipeDream writes one module per stage; here a stage is a list
   of layer indices, and :class:`Pipeline` builds the stage's part of one graph on the
   stage's device.
4. **Runtime** (:func:`schedule`, :func:`simulate`, :class:`Pipeline`). The order in which
   each stage runs the forward (F) and backward (B) passes of the microbatches:

   * **GPipe**: every stage runs all m forwards, then all m backwards. Simple, but a stage
     keeps the activations of all m microbatches until their backwards run.
   * **1F1B** (PipeDream-Flush): stage s runs p - 1 - s *warm-up* forwards, then alternates
     one forward and one backward, then *drains* the remaining backwards. A backward runs
     as early as possible and frees its microbatch's activations, so stage s holds at most
     p - s microbatches' activations, whatever m is: memory bounded by the number of
     stages instead of the number of microbatches.

   Both end with a *flush*: the optimizer steps once every microbatch's backward is done,
   so all microbatches of a minibatch see the same weights and the gradients equal those
   of the whole minibatch (no weight stashing needed, unlike asynchronous PipeDream).
   With uniform stages both have the same idle time, the *bubble*: (p - 1) / (m + p - 1)
   of every stage's time, which shrinks as m grows.

:func:`simulate` plays a schedule with given per-stage costs (an event simulation) and
reports the makespan, the bubble and the activations held; :class:`Pipeline` runs it for
real on minigraph's multi-device runtime, and its gradients equal the plain step's.
"""

from .common import Event, Op, PipelineError
from .execution import Pipeline, PipelineRun
from .partitioning import (SYNC_FACTORS, PipeDreamPlan, partition, partition_pipedream,
                           stage_times)
from .profiling import LayerCost, Profile, fastest_runs, profile
from .scheduling import KINDS, Schedule, peak_in_flight, schedule
from .simulation import (COLORS, Simulation, bubble_closed_form, draw_activations,
                         draw_comparison, draw_timeline, simulate)

__all__ = ["Event", "Op", "PipelineError", "Pipeline", "PipelineRun", "SYNC_FACTORS",
           "PipeDreamPlan", "partition", "partition_pipedream", "stage_times", "LayerCost",
           "Profile", "profile", "fastest_runs", "KINDS", "Schedule", "peak_in_flight",
           "schedule", "COLORS", "Simulation", "bubble_closed_form", "draw_activations",
           "draw_comparison", "draw_timeline", "simulate"]
