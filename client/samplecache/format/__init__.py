"""The wire contract shared by the daemon and the client: records and blocks, the manifest, constants.
Imports neither side."""
