"""``python -m samplecache.service`` = ``samplecache`` (the daemon's CLI), kept for units and scripts written before the
package moved to ``samplecache_service``."""

from samplecache_service.cli.main import main

raise SystemExit(main())
