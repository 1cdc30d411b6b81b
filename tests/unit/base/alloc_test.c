/*
 * alloc_test.c - the out-of-memory policy's helpers (service/base/alloc.h).
 *
 * The helpers copy what they are given and never return NULL. When they
 * cannot allocate they end the process with a message naming what failed
 * and the caller's file and line: checked in a forked child, through the
 * paths that fail without needing the host to run out of memory (a size
 * that overflows, kf_xcheck of NULL), which share the one reporting
 * function with a failed malloc.
 */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "base/alloc.h"

Test(alloc, zero_bytes_are_a_unique_block) {
    void *a = kf_xmalloc(0);
    void *b = kf_xmalloc(0);
    void *c = kf_xcalloc(0, 8);
    cr_assert(a != NULL && b != NULL && c != NULL);
    cr_assert(a != b);
    free(a);
    free(b);
    free(c);
}

Test(alloc, copies_are_exact) {
    char *s = kf_xstrdup("hello");
    cr_assert_str_eq(s, "hello");
    char *n = kf_xstrndup("ab\0cd", 5); /* NUL bytes inside are copied too */
    cr_assert_eq(memcmp(n, "ab\0cd", 6), 0);
    uint8_t bytes[3] = {1, 0, 2};
    uint8_t *m = kf_xmemdup(bytes, sizeof bytes);
    cr_assert_eq(memcmp(m, bytes, sizeof bytes), 0);
    void *empty = kf_xmemdup(NULL, 0);
    cr_assert(empty != NULL);
    free(s);
    free(n);
    free(m);
    free(empty);
}

Test(alloc, calloc_zeroes_and_realloc_keeps_the_prefix) {
    int *v = kf_xcalloc(16, sizeof *v);
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(v[i], 0);
        v[i] = i;
    }
    v = kf_xreallocarray(v, 1024, sizeof *v);
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(v[i], i);
    }
    free(v);
}

/* Runs fn in a child with stderr on a pipe; returns what it wrote and how
 * it ended. */
static void run_child(void (*fn)(void), char *out, size_t cap, int *status) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        fn();
        _exit(0); /* not reached when the policy holds */
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while (len < cap - 1 && (n = read(fds[0], out + len, cap - 1 - len)) > 0) {
        len += (size_t)n;
    }
    out[len] = '\0';
    close(fds[0]);
    cr_assert_eq(waitpid(pid, status, 0), pid);
}

static void overflowing_calloc(void) {
    volatile size_t count = SIZE_MAX / 2 + 1;
    free(kf_xcalloc(count, 2));
}

static void unchecked_null(void) {
    void *nothing = NULL;
    (void)kf_xcheck(nothing);
}

Test(alloc, an_overflowing_size_ends_the_process_naming_the_call_site) {
    char out[1024];
    int status;
    run_child(overflowing_calloc, out, sizeof out, &status);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %d", status);
    cr_assert(strstr(out, "keyflow: out of memory: kf_xcalloc") != NULL, "%s", out);
    cr_assert(strstr(out, "alloc_test.c:") != NULL, "%s", out);
}

Test(alloc, xcheck_of_null_ends_the_process_naming_the_expression) {
    char out[1024];
    int status;
    run_child(unchecked_null, out, sizeof out, &status);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status %d", status);
    cr_assert(strstr(out, "keyflow: out of memory: nothing at ") != NULL, "%s", out);
    cr_assert(strstr(out, "alloc_test.c:") != NULL, "%s", out);
}
