"""Model specs, builders, weights, preprocessing and the registry of loaded models."""
