"""``python -m benchmarks.daemon_scale``: runs ``benchmarks.daemon_scale.main``."""

from .main import main

if __name__ == "__main__":
    raise SystemExit(main())
