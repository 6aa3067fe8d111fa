"""Automatic differentiation: forward mode (dual numbers), reverse mode (a tape),
finite-difference checks, and the ``grad`` entry point that chooses between them."""
