from pkg.util import total_area, load


def main(argv: list[str]) -> int:
    shapes = load(argv[0])
    print(total_area(shapes))
    return 0
