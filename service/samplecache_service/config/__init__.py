"""Configuration: the one settings object, the config file, and redaction of secrets in what is shown."""
