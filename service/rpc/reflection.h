/*
 * reflection.h - the answers of gRPC server reflection (grpc.reflection.v1
 * and v1alpha, whose messages have one wire form), from the API's embedded
 * FileDescriptorSet (api/descriptor_set.h) and the RPC table:
 *
 *   list_services                  every service of the RPC table, which is
 *                                  what this server answers
 *   file_by_filename NAME          that file and the files it imports, every
 *                                  one transitively (so one answer is enough
 *                                  to build any of its types)
 *   file_containing_symbol NAME    the same for the file defining NAME: a
 *                                  service, a method (pkg.Service.Method), a
 *                                  message or an enum, nested ones included,
 *                                  a field or oneof (pkg.Message.field), an
 *                                  enum value (named beside its enum, as
 *                                  protobuf scopes it: pkg.RUN_STATUS_PENDING)
 *   all_extension_numbers_of_type  none, for a known message: keyflow's API
 *                                  defines no extensions
 *   file_containing_extension      NOT_FOUND, for the same reason
 *
 * A name nobody defines is an ErrorResponse with NOT_FOUND naming it (a
 * name holding a NUL byte names nothing); a request that asks nothing,
 * INVALID_ARGUMENT. Either way the stream goes on. valid_host and
 * original_request echo the request's own bytes (protobuf-c would cut a
 * string at a NUL).
 * The index is built once and read-only afterwards: any thread.
 */
#ifndef KF_RPC_REFLECTION_H
#define KF_RPC_REFLECTION_H

#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/status.h"

typedef struct kf_reflection kf_reflection_t;

/* Reads the embedded descriptor set. Errors: KF_E_CORRUPT when it does not
 * parse or a file imports one it lacks (a build error, really). */
kf_status_t kf_reflection_create(kf_reflection_t **out, kf_error_t *err) KF_MUST_USE;
void kf_reflection_destroy(kf_reflection_t *reflection);

/* Answers one serialized ServerReflectionRequest (len bytes, borrowed) with
 * a serialized ServerReflectionResponse allocated in `arena` (*response,
 * *response_len). Errors: KF_E_INVALID when the bytes are not such a
 * request (the caller ends the stream with it); KF_E_TOO_LARGE when the
 * arena is full. */
kf_status_t kf_reflection_answer(const kf_reflection_t *reflection, const uint8_t *request,
                                 size_t len, kf_arena_t *arena, uint8_t **response,
                                 size_t *response_len, kf_error_t *err) KF_MUST_USE;

#endif
