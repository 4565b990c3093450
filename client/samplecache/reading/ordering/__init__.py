"""Which samples an epoch reads, in what order, and who reads each: the global order (one source or a mixture),
the shards' and rows' permutations, the deal of batches to ranks and workers, and a worker's stream of them."""
