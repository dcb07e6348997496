def double(x):
    ‸pass
