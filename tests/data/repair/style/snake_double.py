import os

MAX_ITEMS = 10


def read_config(path_name):
    """Read the configuration."""
    config_text = open(path_name).read()  # the whole file
    line_count = config_text.count("\n")
    return {"text": config_text, "lines": line_count}


def write_config(path_name, config_text):
    # write it back
    out_file = open(path_name, "w")
    out_file.write(config_text)
    base_name = os.path.basename(path_name)
    return base_name


class ConfigStore:
    pass


class ConfigCache:
    pass


class RemoteConfig:
    pass


def count_items(item_list):
    # one pass over the items
    return len(item_list)
