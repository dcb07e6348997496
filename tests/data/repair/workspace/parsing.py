class ParseError(ValueError):
    pass

class Parser:
    def run(self):
        raise ParseError("x")
