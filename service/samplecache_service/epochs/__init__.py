"""Epochs: sealing immutable manifests, the leases that pin them, and the jobs whose epochs map to them."""
