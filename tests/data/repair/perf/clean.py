import re

PATTERN = re.compile(r"\w+")


def words(lines):
    seen = set()
    parts = []
    for line in lines:
        for word in PATTERN.findall(line):
            if word not in seen:
                seen.add(word)
                parts.append(word)
    return " ".join(parts)
