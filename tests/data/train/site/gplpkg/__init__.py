def copyleft() -> str:
    return "GPL code must never enter the corpus"
