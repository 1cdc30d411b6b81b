/*
 * alloc.h - the one out-of-memory policy.
 *
 * Everything keyflow keeps is bounded by service/base/limits.h, and every
 * request is measured against those limits (with a clear error) before
 * memory is taken for it. So when malloc fails, the host is out of memory;
 * no request is to blame, and the engine could not undo half of a step
 * anyway (its batch and its in-memory state change together). The policy:
 *
 *   1. Memory for the process's own state comes from kf_xmalloc & co. They
 *      never return NULL: on failure they print the size and the call site
 *      and abort(), like a failed KF_ASSERT.
 *   2. A function that can fail without having changed anything, and has a
 *      status to say so (a create function, a front end refusing one
 *      request), may return KF_E_NOMEM instead. Libraries linked into other
 *      programs (clients/c) do this everywhere.
 *   3. Never KF_ASSERT(p != NULL) after an allocation: assertions are for
 *      programmer errors, and the policy above says what happens instead.
 *
 * An arena (base/arena.h) gets its chunks with kf_xmalloc, so NULL from an
 * arena always means its byte limit, never the host.
 *
 * These are macros so that the message names the caller's file and line.
 * Any thread.
 */
#ifndef KF_BASE_ALLOC_H
#define KF_BASE_ALLOC_H

#include <stddef.h>

/* malloc(bytes); 0 bytes gives a unique 1-byte block. Free with free(). */
#define kf_xmalloc(bytes) kf__xmalloc((bytes), __FILE__, __LINE__)
/* calloc(count, size), zeroed; aborts as well when count * size overflows. */
#define kf_xcalloc(count, size) kf__xcalloc((count), (size), __FILE__, __LINE__)
/* realloc(p, bytes); p may be NULL. On failure p is not freed (nor needed:
 * the process ends). */
#define kf_xrealloc(p, bytes) kf__xrealloc((p), (bytes), __FILE__, __LINE__)
/* realloc to count elements of size bytes, checking the multiplication. */
#define kf_xreallocarray(p, count, size) kf__xreallocarray((p), (count), (size), __FILE__, __LINE__)
/* A NUL-terminated copy of s. */
#define kf_xstrdup(s) kf__xstrdup((s), __FILE__, __LINE__)
/* A NUL-terminated copy of the first len bytes of s (which may hold NULs). */
#define kf_xstrndup(s, len) kf__xmemdup((s), (len), 1, __FILE__, __LINE__)
/* A copy of len bytes (len may be 0: a unique 1-byte block). */
#define kf_xmemdup(p, len) kf__xmemdup((p), (len), 0, __FILE__, __LINE__)

void *kf__xmalloc(size_t bytes, const char *file, int line);
void *kf__xcalloc(size_t count, size_t size, const char *file, int line);
void *kf__xrealloc(void *p, size_t bytes, const char *file, int line);
void *kf__xreallocarray(void *p, size_t count, size_t size, const char *file, int line);
char *kf__xstrdup(const char *s, const char *file, int line);
void *kf__xmemdup(const void *p, size_t len, int nul_terminate, const char *file, int line);

/* For libraries that return NULL only when out of memory (jansson's
 * json_dumps of a value it built, json_array()): returns p, or ends the
 * process like the helpers above. */
#define kf_xcheck(p) kf__xcheck((p), #p, __FILE__, __LINE__)

void *kf__xcheck(void *p, const char *what, const char *file, int line);

/* Ends the process: "keyflow: out of memory: <what> of <bytes> bytes at
 * <file>:<line>" (without "of ... bytes" when bytes is 0: unknown). Written
 * without allocating. */
_Noreturn void kf__out_of_memory(const char *what, size_t bytes, const char *file, int line);

#endif
