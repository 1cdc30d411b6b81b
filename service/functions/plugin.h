/*
 * plugin.h - native handler plugins: found in the configured directory by
 * the SHA-256 of their bytes, and loaded from exactly those bytes. Only
 * regular files (no symlinks) owned by root or keyflowd's user and not
 * writable by group or others are candidates.
 *
 * A file is read once into memory, hashed, copied into an anonymous memory
 * file (memfd) and dlopen()ed from there, so the code that runs is the code
 * that was hashed even if the file on disk changes meanwhile. Loaded
 * plugins stay loaded until kf_plugins_destroy (a handler may be shared by
 * several functions); no handler pointer may be used after it. Engine-thread only; loading reads
 * files (blocking I/O), which happens only at registration and at start.
 */
#ifndef KF_FUNCTIONS_PLUGIN_H
#define KF_FUNCTIONS_PLUGIN_H

#include "base/status.h"
#include "keyflow/handler.h"

typedef struct kf_plugins kf_plugins_t;

/* dir may be NULL (no plugins: every lookup fails with a clear message). */
kf_plugins_t *kf_plugins_create(const char *dir);
void kf_plugins_destroy(kf_plugins_t *plugins);

/* The handler whose file hashes to digest_hex. Errors: KF_E_PRECONDITION
 * (no plugin directory, or no file with that digest), KF_E_INVALID (the
 * file is not a handler of ABI version KF_HANDLER_ABI_VERSION). Messages
 * name the digest, never a server path (those go to the log). */
kf_status_t kf_plugins_find(kf_plugins_t *plugins, const char *digest_hex,
                            const kf_handler_t **handler, kf_error_t *err) KF_MUST_USE;

#endif
