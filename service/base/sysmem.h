/*
 * sysmem.h - how much memory the process may use: its cgroup's memory
 * limit, or the machine's memory. keyflowd derives the default of
 * --memory-budget from it (docs/semantics.md, "Memory budget").
 *
 * Pure reads of /proc and /sys; any thread.
 */
#ifndef KF_BASE_SYSMEM_H
#define KF_BASE_SYSMEM_H

#include <stddef.h>
#include <stdint.h>

/*
 * The memory limit of the calling process's cgroup, in bytes, or 0 when it
 * has none. `proc_cgroup` is the process's cgroup file (normally
 * "/proc/self/cgroup") and `root` where cgroups are mounted (normally
 * "/sys/fs/cgroup"): tests point them elsewhere.
 *   - cgroup v2 (a "0::/path" line): the lowest memory.max of the process's
 *     cgroup and its ancestors ("max" is no limit); inside a container,
 *     whose own cgroup is the root of its view, <root>/memory.max.
 *   - cgroup v1 (a "N:...memory...:/path" line): memory.limit_in_bytes of
 *     <root>/memory/<path>, else of <root>/memory; a value of 2^62 or more
 *     is v1's "no limit".
 * `source` (source_cap bytes, may be 0) receives the file the limit came
 * from, for logs.
 */
uint64_t kf_cgroup_memory_limit(const char *proc_cgroup, const char *root, char *source,
                                size_t source_cap);

/* The machine's physical memory in bytes (sysconf), or 0 if unknown. */
uint64_t kf_physical_memory_bytes(void);

#endif
