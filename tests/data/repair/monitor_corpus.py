# Training text for the small BPE tokenizer of tests/test_repair_monitor.py (merges across dots).
import os
import re

items = []
items.append(os.path.join("a", "b"))
items.extend(os.listdir("."))
value = os.getcwd()
name = os.path.basename(value)
items.append(name)
items.pop()
env = os.environ.get("HOME")
parts = os.path.split(value)
pattern = re.compile(r"\w+")
found = pattern.findall(value)
os.path.exists(value)
os.path.isdir(value)
os.sep.join(parts)
result = os.fetch_data()
result = os.pathx
result = os.getcwdd()
items.appendx(value)
items.foo(value)
