names = ['a']
numbers = [1]
count = len(na‸)
