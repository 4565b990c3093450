"""The samplecache daemon. Never imports torch."""
