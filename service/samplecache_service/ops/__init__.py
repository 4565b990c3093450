"""Operations: thread health, the recent history, charts, logs, and run-time changes (PATCH /v1/config, SIGHUP)."""
