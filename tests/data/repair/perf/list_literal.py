def count_vowels(text):
    n = 0
    for ch in text:
        if ch in ["a", "e", "i", "o", "u"]:
            n = n + 1
    return n
