/* assert.c - the one place an assertion failure ends the process. */
#include "base/assert.h"

#include <stdio.h>
#include <stdlib.h>

void kf__assert_fail(const char *expr, const char *file, int line, const char *func) {
    fprintf(stderr, "keyflow: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
