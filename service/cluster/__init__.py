"""hookserve on Ray Serve: the same HTTP API from replicas across machines (`pip install "hookserve[ray]"`).

Only `python -m service.cluster` and the Serve deployments import Ray; `service.main` and
`python -m service` never do. See docs/cluster.md.
"""
