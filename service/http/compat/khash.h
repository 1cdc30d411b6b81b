/*
 * khash.h - the names <h2o/http2_internal.h> takes from h2o's bundled
 * khash, so that conns.c can read h2o 2.2.5's HTTP/2 connection and stream
 * structs (where a stream's request body is buffered). Debian's
 * libh2o-evloop-dev installs that header but not the khash.h it includes.
 *
 * The stream table is declared as a pointer to an incomplete type, which
 * is all the connection struct's layout needs: conns.c never touches the
 * table (it reaches streams through the public scheduler tree), and a use
 * of the table's accessors would fail to link.
 */
#ifndef KF_HTTP_COMPAT_KHASH_H
#define KF_HTTP_COMPAT_KHASH_H

#include <stddef.h>
#include <stdint.h>

typedef uint32_t khiter_t;

#define khash_t(name)                          kh_##name##_t
#define KHASH_MAP_INIT_INT64(name, value_type) typedef struct kh_##name##_s kh_##name##_t;

khiter_t kf_h2o_khash_is_not_available(void);
#define kh_get(name, table, key) ((void)(table), (void)(key), kf_h2o_khash_is_not_available())
#define kh_end(table)            ((void)(table), (khiter_t)0)
#define kh_val(table, iter)      ((void)(table), (void)(iter), NULL)

#endif
