"""One router per resource: epochs and leases, jobs, control, quarantine."""
