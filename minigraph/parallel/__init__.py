"""Parallelism: data parallelism (scatter, replicate, allreduce), model parallelism (a
class-sharded classifier with a memory-balanced cross-entropy) and pipeline parallelism
(``from minigraph.parallel import pipeline as pp``); ``cost_model``: the bytes each device
sends, one model for chapters 07 and 08, which the runs' counters check."""

from .data_parallel import (CommStats, allreduce, allreduce_across_ranks, allreduce_with_stats,
                            data_parallel_grads, data_parallel_grads_across_ranks, gather,
                            replicate, scatter, shard)
from .model_parallel import LayerSplitMLP, ShardedLinear, parallel_cross_entropy
from . import cost_model, pipeline

__all__ = ["CommStats", "allreduce", "allreduce_across_ranks", "allreduce_with_stats",
           "data_parallel_grads", "data_parallel_grads_across_ranks", "gather", "replicate",
           "scatter", "shard", "LayerSplitMLP", "ShardedLinear", "parallel_cross_entropy",
           "cost_model", "pipeline"]
