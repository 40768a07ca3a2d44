"""`make bench`: hookserve against raw torch on the same machine, in one run (see bench/README.md)."""
