class Classic:
    """A BSD-licensed fixture declared through trove classifiers only."""

    def __init__(self, value: int) -> None:
        self.value = value
