slow = ‸
fast = 
