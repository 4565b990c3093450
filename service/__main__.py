from samplecache.service.cli import main

raise SystemExit(main())
