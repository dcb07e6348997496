def held_out() -> str:
    return "evaluation only"
