"""Shapes with areas and a registry."""

import json
import re as regex
from dataclasses import dataclass

UNIT = "cm"


class Shape:
    """Base class of every shape."""

    sides = 0

    def area(self) -> float:
        """The area in square units."""
        raise NotImplementedError

    def describe(self, precision: int = 2) -> str:
        return f"{type(self).__name__} {self.area():.{precision}f}{UNIT}"


@dataclass
class Square(Shape):
    side: float

    def __post_init__(self) -> None:
        self.checked = True

    def area(self) -> float:
        return self.side * self.side

    def to_json(self) -> str:
        return json.dumps({"side": self.side})


def parse_shape(text: str) -> Shape:
    """Parse 'square 3' into a Square."""
    match = regex.match(r"square (\d+)", text)
    if match is None:
        raise ValueError(text)
    size = float(match.group(1))
    return Square(size)
