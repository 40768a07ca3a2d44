"""The TorchServe-compatible front, for users arriving with TorchServe's scripts, clients and `.mar` archives.

`inference.py`: TorchServe's inference API (`/ping`, `/predictions/{model}`, `/explanations/{model}`) on
hookserve's HTTP port; `management.py`: its management API (list, describe, register, scale,
unregister) as an app of its own on `torchserve_management_port`, since its `/models` paths are
hookserve's own on the main port. Both answer errors in TorchServe's envelope (`errors.py`) and make
one data-plane call per request (`service.dataplane.torchserve`).
"""
