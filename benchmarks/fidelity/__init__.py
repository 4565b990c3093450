"""The fidelity benchmark: does the rolling 25% cache train as well as the full data?

``python -m benchmarks.fidelity`` runs ``main`` (the command line); the other modules are its parts.
"""
