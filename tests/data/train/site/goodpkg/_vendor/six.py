PY3 = True
