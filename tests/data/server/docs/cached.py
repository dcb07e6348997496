fast = ‸
