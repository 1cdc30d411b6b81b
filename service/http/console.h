/*
 * console.h - the web console's files (docs/console.md): a fixed set of
 * HTML, CSS and JavaScript files under service/http/console/, compiled into
 * keyflowd by service/http/console/embed.cmake. The gateway serves them at
 * GET / (the page) and GET /ui/<name>; the page itself only calls the /v1
 * routes, with the API key its user typed, so it can do nothing a client
 * with that key could not.
 *
 * Nothing here is read from disk at run time and nothing is generated per
 * request: the bytes, their Content-Type and their ETag are constants.
 */
#ifndef KF_HTTP_CONSOLE_H
#define KF_HTTP_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kf_console_file {
    const char *path;         /* "/ui/app.js" */
    const char *content_type; /* "text/javascript; charset=utf-8" */
    const unsigned char *body;
    size_t body_len;
    const char *etag; /* quoted: "\"3f9a0c1b2d3e4f50\"" (SHA-256 of the body, cut) */
} kf_console_file_t;

/* The security headers every console file is sent with: the page runs no
 * inline script or style and talks to no other origin (connect-src
 * 'self'), and no other site may frame it. */
#define KF_CONSOLE_CSP                                                                             \
    "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "              \
    "frame-ancestors 'none'"

/* Whether the path (without its query) is the console's: "/", "/ui" or
 * anything under "/ui/". Such a path is answered by the console alone: a
 * file, or 404 for a name it does not have. */
bool kf_console_claims(const char *path, size_t path_len);

/* The file a console path names ("/", "/ui" and "/ui/" name index.html), or
 * NULL. The file is static: valid for the process's lifetime. */
const kf_console_file_t *kf_console_find(const char *path, size_t path_len);

/* The generated table (console_files.c): kf__console_file_count rows. */
extern const kf_console_file_t kf__console_files[];
extern const size_t kf__console_file_count;

#endif
