"""samplecache's benchmarks, a package run from the repository root:

    .venv/bin/python -m benchmarks.suite --quick
    .venv/bin/python -m benchmarks.read_throughput --help

What they share (data, daemon, S3 server, verification, flags, report, host facts, missing peers and tools)
lives in ``benchmarks.harness``; each benchmark is a short ``main`` over it and imports no other benchmark
(an import-linter contract in pyproject.toml). A benchmark with parts of its own is a package: ``ingest/``,
``daemon_scale/``, ``suite/`` (with the peers' formats) and ``fidelity/`` hold ``main.py`` (the command line),
``__main__.py`` (``python -m benchmarks.<name>``) and their parts; the others are one module each.
"""
