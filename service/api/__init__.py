"""Thin HTTP routers: decode -> submit -> encode. The only package that imports FastAPI."""
