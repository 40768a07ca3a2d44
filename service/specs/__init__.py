"""The torch-free leaf: model specs (the models TOML) and the API's closed vocabularies.

Every other package may import this one; it imports only `service.errors`.
"""
