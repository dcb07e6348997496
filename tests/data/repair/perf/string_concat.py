def render(rows):
    out = ""
    for row in rows:
        out += f"{row}\n"
    return out
