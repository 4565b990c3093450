"""Reading a sealed epoch: the LMDB reader, the epoch source and clock, the split over ranks and workers, batches."""
