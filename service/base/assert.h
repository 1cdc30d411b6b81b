/*
 * assert.h - assertions that stay on in every build.
 *
 * KF_ASSERT is for programmer errors only (a broken invariant, a violated
 * precondition). Bad input, a full disk or a lost peer are statuses, never
 * assertions. On failure it prints file, line and expression and aborts, so
 * that a broken invariant never reaches the disk.
 */
#ifndef KF_BASE_ASSERT_H
#define KF_BASE_ASSERT_H

_Noreturn void kf__assert_fail(const char *expr, const char *file, int line, const char *func);

#define KF_ASSERT(expr) ((expr) ? (void)0 : kf__assert_fail(#expr, __FILE__, __LINE__, __func__))

/* Marks code that cannot be reached when the invariants hold. */
#define KF_UNREACHABLE() kf__assert_fail("unreachable", __FILE__, __LINE__, __func__)

#endif
