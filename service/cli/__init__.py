"""The `hookserve` command: `serve` runs the server; the other commands talk to one over HTTP only.

Every command except `serve` and `check` uses `service.client` and nothing of the server;
`check` shares `service.config_check` with the server's start-up.
"""
