"""Runnable examples of the chapters, started as modules.

* ``mpiexec -n 2 python -m minigraph.examples.mpi_textbook``: chapter 06, section 6: the
  textbook's z = x*y + sin(x) with x on rank 0 and y, z on rank 1; two branches of
  matmuls on two processes against one.
* ``mpiexec -n 2 python -m minigraph.examples.mpi_data_parallel``: chapter 07, section 4:
  data parallelism with ``mg.distributed.all_reduce``; an MLP split by layer across two
  ranks, trained in graph mode.
"""


def one_blas_thread() -> None:
    """One BLAS thread in this process, so that two ranks use two cores rather than four
    threads fighting for two (the second rank then runs beside the first, not against it).

    ``OPENBLAS_NUM_THREADS=1`` and its siblings only count before NumPy loads BLAS, and
    ``python -m minigraph.examples.X`` loads NumPy with the ``minigraph`` package, before
    the example's first line: an example that set them itself ran with every BLAS thread,
    and two ranks were slower than one on an idle machine. threadpoolctl resizes the
    pool of the BLAS that is loaded."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise SystemExit("the MPI examples need threadpoolctl: pip install 'minigraph[mpi]'") \
            from None
    threadpool_limits(limits=1)

