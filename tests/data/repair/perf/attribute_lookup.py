import math


class Stats:
    def norms(self, points):
        for p in points:
            self.results.values.append(math.sqrt(p[0] * p[0] + p[1] * p[1]))
