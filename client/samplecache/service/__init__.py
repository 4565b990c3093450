"""Compatibility: ``python -m samplecache.service`` still runs the daemon's CLI, which lives in
``samplecache_service``."""
