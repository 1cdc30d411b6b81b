/*
 * descriptor_set.h - the API's protos as a google.protobuf.FileDescriptorSet,
 * made at build time by `protoc --descriptor_set_out --include_imports
 * --include_source_info` over every .proto under api/ and embedded in the
 * binaries that link kf_api_descriptors: what gRPC server reflection serves
 * (the FileDescriptorProtos, comments included) and where the OpenAPI
 * document takes its descriptions from.
 *
 * Constant for the life of the process; any thread.
 */
#ifndef KF_API_DESCRIPTOR_SET_H
#define KF_API_DESCRIPTOR_SET_H

#include <stddef.h>

extern const unsigned char kf_api_descriptor_set[];
extern const size_t kf_api_descriptor_set_bytes;

#endif
