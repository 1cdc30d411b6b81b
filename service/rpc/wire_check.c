/* wire_check.c - descriptor-driven walk of protobuf wire bytes. */
#include "rpc/wire_check.h"

#include <stdio.h>
#include <string.h>

#include "base/limits.h"
#include "base/text.h"

typedef struct reader {
    const uint8_t *p;
    const uint8_t *end;
} reader_t;

static bool varint(reader_t *r, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) {
            return false;
        }
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *out = v;
            return true;
        }
    }
    return false;
}

static bool skip(reader_t *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) {
        return false;
    }
    r->p += n;
    return true;
}

static kf_status_t walk(const ProtobufCMessageDescriptor *desc, reader_t *r, const char *path,
                        int depth, kf_error_t *err) {
    if (depth > KF_JSON_DEPTH_MAX) {
        return kf_error_set(err, KF_E_INVALID, "request: nested deeper than %d", KF_JSON_DEPTH_MAX);
    }
    while (r->p < r->end) {
        uint64_t key;
        if (!varint(r, &key)) {
            return kf_error_set(err, KF_E_INVALID, "request: malformed %s message", desc->name);
        }
        uint32_t number = (uint32_t)(key >> 3);
        int wire = (int)(key & 7);
        uint64_t len = 0;
        bool ok = true;
        switch (wire) {
        case 0: ok = varint(r, &len); break;
        case 1: ok = skip(r, 8); break;
        case 5: ok = skip(r, 4); break;
        case 2: {
            ok = varint(r, &len) && len <= (uint64_t)(r->end - r->p);
            if (!ok) {
                break;
            }
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(desc, number);
            reader_t sub = {r->p, r->p + len};
            r->p += len;
            if (f == NULL) {
                break;
            }
            char child[256];
            snprintf(child, sizeof child, "%s%s%s", path, path[0] ? "." : "", f->name);
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                if (memchr(sub.p, 0, len) != NULL) {
                    return kf_error_set(err, KF_E_INVALID, "%s: contains a NUL byte", child);
                }
                if (!kf_utf8_valid((const char *)sub.p, len)) {
                    return kf_error_set(err, KF_E_INVALID, "%s: not valid UTF-8", child);
                }
            } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                kf_status_t st = walk(f->descriptor, &sub, child, depth + 1, err);
                if (st != KF_OK) {
                    return st;
                }
            }
            break;
        }
        default: ok = false; /* groups (3, 4) are not proto3 */
        }
        if (!ok) {
            return kf_error_set(err, KF_E_INVALID, "request: malformed %s message", desc->name);
        }
    }
    return KF_OK;
}

kf_status_t kf_wire_check(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                          kf_error_t *err) {
    reader_t r = {data, data + len};
    return walk(desc, &r, "", 0, err);
}
