def total(items):
    ‸
