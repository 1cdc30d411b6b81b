/*
 * placement.h - which process (node) serves which partitions, and where:
 * the placement file that keyflowd (--placement, to name a partition's
 * owner and, with --node, its own partitions), the CLI and the proxy's
 * configuration read (docs/scaling.md). In Kubernetes it is a ConfigMap.
 *
 *   # comments and blank lines are ignored
 *   partitions 8
 *   node keyflow-0 0-2 keyflow-0.keyflow:50051 keyflow-0.keyflow:8070
 *   node keyflow-1 3-5 keyflow-1.keyflow:50051 keyflow-1.keyflow:8070
 *   node keyflow-2 6-7 keyflow-2.keyflow:50051
 *
 * "partitions" comes first; each node line names the node, its partitions
 * (base/partition.h's set syntax), its gRPC address and optionally its
 * HTTP address. Nodes' sets never overlap (a partition has one owner); a
 * partition no node names has no owner (its calls say so).
 *
 * A placement is immutable once parsed; any thread may read it.
 */
#ifndef KF_BASE_PLACEMENT_H
#define KF_BASE_PLACEMENT_H

#include <stddef.h>

#include "base/partition.h"
#include "base/status.h"

#define KF_NODE_NAME_BYTES_MAX 64

typedef struct kf_placement_node {
    char name[KF_NODE_NAME_BYTES_MAX];
    kf_partition_set_t partitions;
    char grpc_address[KF_ADDRESS_BYTES_MAX];
    char http_address[KF_ADDRESS_BYTES_MAX]; /* "" when the line gives none */
} kf_placement_node_t;

typedef struct kf_placement {
    uint32_t partition_count;
    size_t node_count;
    kf_placement_node_t *nodes; /* owned */
} kf_placement_t;

/* Parses a placement file's text; `source` names it in errors ("FILE:LINE:
 * what is wrong"). Errors: KF_E_INVALID, KF_E_NOMEM. */
kf_status_t kf_placement_parse(const char *text, const char *source, kf_placement_t **out,
                               kf_error_t *err) KF_MUST_USE;
/* Reads and parses a file (at most 1 MiB). Errors: KF_E_IO, and as above. */
kf_status_t kf_placement_load(const char *path, kf_placement_t **out, kf_error_t *err) KF_MUST_USE;
void kf_placement_destroy(kf_placement_t *placement);
/* The node serving `partition`, or NULL. */
const kf_placement_node_t *kf_placement_owner(const kf_placement_t *placement, uint32_t partition);
/* The node named `name`, or NULL. */
const kf_placement_node_t *kf_placement_node(const kf_placement_t *placement, const char *name);

#endif
