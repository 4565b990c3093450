"""The remote store: fsspec access, discovery of files and their footers, column schemas, the planner of units."""
