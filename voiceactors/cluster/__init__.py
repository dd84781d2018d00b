"""Scaling out: the registry that decides which process runs each call
(in memory for one process, Redis for several; docs/operations.md § Scaling out)."""
