"""Toy models and helpers that tests share: models with exact, hand-checkable answers; waiting on events."""
