"""The trainer-side commands of the CLI (`samplecache demo`, `samplecache bench`) and a daemon launcher: outside the
library's import path."""
