"""Sampling: the scheduler that owns the sampling state, the sampler subprocesses, encoding, pacing and traffic."""
