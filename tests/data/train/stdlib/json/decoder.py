def parse_flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes")
