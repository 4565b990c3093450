"""The daemon's HTTP API as the client speaks it: requests with deadlines, the token, jobs and leases."""
