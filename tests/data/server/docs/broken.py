broken = ‸
