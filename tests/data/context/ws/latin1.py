def café():
    return "naïve"


def after():
    return 2
