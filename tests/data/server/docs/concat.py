def concat(words):
    text = ''
    for word in words:
        ‸text += word
    return text
