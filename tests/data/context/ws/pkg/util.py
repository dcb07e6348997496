import os.path
from pkg.shapes import Square, parse_shape

MAX_SIZE = 100


def total_area(shapes: list) -> float:
    total = 0.0
    for shape in shapes:
        total += shape.area()
    return total


def load(path: str) -> list:
    name = os.path.basename(path)
    with open(path) as handle:
        return [parse_shape(line) for line in handle if line.strip()] + [Square(len(name))]
