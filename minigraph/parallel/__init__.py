"""Parallelism: data parallelism (scatter, replicate, allreduce) and model parallelism
(a class-sharded classifier with a memory-balanced cross-entropy)."""

from .data_parallel import (CommStats, allreduce, allreduce_with_stats, data_parallel_grads,
                            gather, replicate, scatter)
from .model_parallel import ShardedLinear, parallel_cross_entropy

__all__ = ["CommStats", "allreduce", "allreduce_with_stats", "data_parallel_grads", "gather",
           "replicate", "scatter", "ShardedLinear", "parallel_cross_entropy"]
