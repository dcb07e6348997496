def common(a, b):
    seen = list(b)
    hits = []
    for x in a:
        if x in seen:
            hits.append(x)
    return hits
