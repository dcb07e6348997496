def greet(name):
    message‸
    return message
