"""One module per resource; each holds a `router` that `service.main` lists."""
