def frobnicate_widgets(widgets: list, level: int) -> int:
    """ Count the widgets whose level exceeds the given threshold level.
    >>> frobnicate_widgets([], 1)
    0
    """
    return sum(1 for w in widgets if w > level)
