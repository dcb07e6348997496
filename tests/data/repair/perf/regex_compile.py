import re


def words(lines):
    found = []
    for line in lines:
        pattern = re.compile(r"\w+")
        found.extend(pattern.findall(line))
    return found
