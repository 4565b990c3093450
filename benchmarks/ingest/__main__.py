"""``python -m benchmarks.ingest``: runs ``benchmarks.ingest.main``."""

import sys

from .main import main

if __name__ == "__main__":
    sys.exit(main())
