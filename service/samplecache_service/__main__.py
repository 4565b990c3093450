"""``python -m samplecache_service``: the daemon's CLI (the ``samplecache`` command)."""

from samplecache_service.cli.main import main

raise SystemExit(main())
