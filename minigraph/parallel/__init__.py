"""Parallelism: data parallelism (scatter, replicate, allreduce), model parallelism (a
class-sharded classifier with a memory-balanced cross-entropy) and pipeline parallelism
(``from minigraph.parallel import pipeline as pp``)."""

from .data_parallel import (CommStats, allreduce, allreduce_across_ranks, allreduce_with_stats,
                            data_parallel_grads, data_parallel_grads_across_ranks, gather,
                            replicate, scatter, shard)
from .model_parallel import LayerSplitMLP, ShardedLinear, parallel_cross_entropy
from . import pipeline

__all__ = ["CommStats", "allreduce", "allreduce_across_ranks", "allreduce_with_stats",
           "data_parallel_grads", "data_parallel_grads_across_ranks", "gather", "replicate",
           "scatter", "shard", "LayerSplitMLP", "ShardedLinear", "parallel_cross_entropy",
           "pipeline"]
