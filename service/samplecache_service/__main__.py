"""``python -m samplecache_service``: the daemon's CLI (the ``samplecache`` command)."""

from samplecache_service.cli import main

raise SystemExit(main())
