"""The `kvproxy` command: the proxy's commands plus the audit job's, in one program."""
