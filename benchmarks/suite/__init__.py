"""The suite benchmark: samplecache against the peer loaders on the same data, every batch verified.

``python -m benchmarks.suite`` runs ``main`` (the command line); the other modules are its parts.
"""
