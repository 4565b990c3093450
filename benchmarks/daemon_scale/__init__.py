"""The daemon_scale benchmark: manifest latency under 64 clients, daemon RSS and read rate, at 100k shards.

``python -m benchmarks.daemon_scale`` runs ``main`` (the command line); the other modules are its parts.
"""
