"""From LMDB blocks to arrays: the read transaction's block views, the gathers (on more than one core), the column
maps of sources that store their columns in other orders or types, and the reused output buffers."""
