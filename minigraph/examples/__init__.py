"""Runnable examples of the chapters, started as modules.

* ``mpiexec -n 2 python -m minigraph.examples.mpi_textbook``: chapter 06, section 6: the
  textbook's z = x*y + sin(x) with x on rank 0 and y, z on rank 1; two branches of
  matmuls on two processes against one.
* ``mpiexec -n 2 python -m minigraph.examples.mpi_data_parallel``: chapter 07, section 4:
  data parallelism with ``mg.distributed.all_reduce``; an MLP split by layer across two
  ranks, trained in graph mode.
"""
