"""Shared test helpers: toy models with hand-set weights, loaded models without a registry."""
