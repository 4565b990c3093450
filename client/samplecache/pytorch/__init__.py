"""The PyTorch adapter: the IterableDataset, its DataLoader, collation and the DDP topology."""
