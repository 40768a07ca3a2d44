"""Pydantic request and response models: the OpenAPI page. No torch here."""
