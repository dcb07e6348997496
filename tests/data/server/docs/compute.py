def compute(x):
    return x


answer = compute(‸)
print(answer)
