def good(a, b):
    return a + b


def half(x:
    return x +


class StillHere:
    def method(self):
        return 1
