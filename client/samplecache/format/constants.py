"""Numbers and names that the daemon and the client must agree on, each defined once."""

from __future__ import annotations

# The API token's file in the cache dir: the only file name a daemon may point a client at.
TOKEN_FILE_NAME = "api-token"

# LMDB reader slots (the daemon opens the environment with them; every reader must ask for the same number):
# one per thread of every rank x DataLoader worker on the host, far above LMDB's default of 126.
MAX_READERS = 4096

# The largest epoch, count or position a request or a client may name: exact as a float (JSON tools compare as
# floats) and far from int64's end (the client's epoch clock adds to them).
MAX_NUMBER = 2**53

# The LMDB named db of the cache's meta values (JSON each), and the key of the cache's identity in it: a random id
# written once, when the daemon first opens a cache. Every manifest names it, so a reader never takes a shard id
# from another cache that was put at the same path (a new cache numbers its shards from 1 again).
META_DB = b"meta"
CACHE_ID_KEY = "cache_id"
