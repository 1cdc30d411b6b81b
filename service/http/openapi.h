/*
 * openapi.h - the gateway's OpenAPI 3.1 document (GET /openapi.json),
 * written at start-up from what the gateway itself runs on, never by hand:
 *
 *   paths        one operation per row of the route table (routes.h), one
 *                per RPC's generic route (POST /v1/<package.Service>/<Method>),
 *                and the probes, /metrics and this document
 *   parameters   the route's path captures; for a route without a body every
 *                other scalar field of the request is a query parameter, under
 *                its alias where the route gives one, with the route's defaults
 *   bodies       the request message, or the one field the route binds the
 *                body to; responses are the RPC's response message
 *   schemas      every message reachable from those, field by field from the
 *                protobuf-c descriptors, following proto/json_map.h's rules
 *                (lowerCamelCase names, 64-bit integers as strings, enums by
 *                name, bytes as base64, `_json` fields as embedded JSON values,
 *                unknown fields refused); descriptions are the .proto comments,
 *                read from the embedded descriptor set (api/descriptor_set.h)
 *   errors       {"code", "status", "message"} for every 4XX and 5XX
 *
 * So the document changes exactly when the routes or the protos do.
 */
#ifndef KF_HTTP_OPENAPI_H
#define KF_HTTP_OPENAPI_H

#include <stddef.h>

#include "base/status.h"

/* The document as compact JSON text, malloc'd (caller frees), *len bytes
 * without the NUL. `version` (borrowed) is the API's version in info.
 * Errors: KF_E_CORRUPT when the embedded descriptor set does not parse,
 * KF_E_NOMEM. */
kf_status_t kf_openapi_render(const char *version, char **out, size_t *len,
                              kf_error_t *err) KF_MUST_USE;

#endif
