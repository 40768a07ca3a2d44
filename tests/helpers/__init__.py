"""Shared test helpers: toy models with exact, hand-checkable answers, loaded models without a registry,
waiting on events, comparing batched answers."""
