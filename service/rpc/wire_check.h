/*
 * wire_check.h - a check of protobuf wire bytes before protobuf-c unpacks
 * them: every string field (at any depth) must be valid UTF-8 without NUL
 * bytes. protobuf-c stores strings NUL-terminated without their length, so a
 * NUL inside a key or producer ID would silently cut it short and merge two
 * identities; proto3 requires valid UTF-8 anyway. Walks the bytes once,
 * driven by the message descriptor; unknown fields are skipped. Pure.
 */
#ifndef KF_RPC_WIRE_CHECK_H
#define KF_RPC_WIRE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base/status.h"

/* KF_OK, or KF_E_INVALID naming the field ("event.id: ...") when a string
 * holds a NUL or invalid UTF-8, or when the bytes are not a well-formed
 * message (then the message says so). */
kf_status_t kf_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                          kf_error_t *err) KF_MUST_USE;

#endif
