"""The ``samplecache`` command (``main``): a module per command that needs more than a few lines."""

from samplecache_service.cli.main import main

__all__ = ["main"]
