"""The ingest benchmark: S3 -> LMDB ingest rate against raw s3fs reads of the same row groups.

``python -m benchmarks.ingest`` runs ``main`` (the command line); the other modules are its parts.
"""
