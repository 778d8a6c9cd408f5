"""Attention backends: the pure-PyTorch reference oracle and optimized kernels' glue."""

from specdec.attention.reference import ReferenceBackend

__all__ = ["ReferenceBackend"]
