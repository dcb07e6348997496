import json


class ConfigError(ValueError):
    """The configuration is invalid."""


class StoreError(Exception):
    pass


def load(path):
    if not path:
        raise ConfigError("empty path")
    with open(path) as handle:
        return handle.read()


def save(path, data):
    if data is None:
        raise StoreError("nothing to save")
