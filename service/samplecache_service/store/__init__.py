"""The local store: the one LMDB writer, the catalog, staging files, eviction, the budget, disk space, verify."""
