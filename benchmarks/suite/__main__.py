"""``python -m benchmarks.suite``: runs ``benchmarks.suite.main``."""

from .main import main

if __name__ == "__main__":
    raise SystemExit(main())
