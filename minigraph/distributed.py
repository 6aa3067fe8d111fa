"""Several processes on MPI: ``mg.distributed`` (being written; see issue [5/6])."""
