"""samplecache's benchmarks, a package run from the repository root:

    .venv/bin/python -m benchmarks.suite --quick
    .venv/bin/python -m benchmarks.read_throughput --help

What they share (data, daemon, S3 server, verification, flags, report, host facts, missing peers and tools)
lives in ``benchmarks.harness``; each benchmark module is a short ``main`` over it.
"""
