#include <stdio.h>
#include "util.h"

#define MAX_LEN 64

struct point {
    int x;
    int y;
};

static int clamp(int value, int lo, int hi) {
    if (value < lo) return lo;
    return value > hi ? hi : value;
}

int main(void) {
    printf("%d\n", clamp(5, 0, 3));
    return 0;
}
