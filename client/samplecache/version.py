"""The package's version, in a leaf module that the daemon imports without the client's lazy ``__init__``."""

__version__ = "0.1.0"
