/* sysmem_test.c - the cgroup memory limit over fake /proc and /sys trees. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/sysmem.h"

static char root[64];
static char proc[128];

static void setup(void) {
    strcpy(root, "/tmp/kf-sysmem-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    snprintf(proc, sizeof proc, "%s/cgroup", root);
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(sysmem, .init = setup, .fini = teardown);

static void write_file(const char *rel, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdir(path, 0700);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static uint64_t limit(char *source) {
    char fs[128];
    snprintf(fs, sizeof fs, "%s/fs", root);
    return kf_cgroup_memory_limit(proc, fs, source, source != NULL ? 256 : 0);
}

Test(sysmem, v2_takes_the_lowest_limit_up_the_tree) {
    write_file("cgroup", "0::/kubepods/pod1/c1\n");
    write_file("fs/kubepods/pod1/c1/memory.max", "max\n");
    write_file("fs/kubepods/pod1/memory.max", "2147483648\n");
    write_file("fs/kubepods/memory.max", "8589934592\n");
    char source[256];
    cr_assert_eq(limit(source), 2147483648ULL);
    cr_assert(strstr(source, "pod1/memory.max") != NULL, "%s", source);
}

Test(sysmem, v2_inside_a_container_reads_its_root) {
    write_file("cgroup", "0::/\n");
    write_file("fs/memory.max", "536870912\n");
    cr_assert_eq(limit(NULL), 536870912ULL);
}

Test(sysmem, v2_max_everywhere_is_no_limit) {
    write_file("cgroup", "0::/user.slice\n");
    write_file("fs/user.slice/memory.max", "max\n");
    cr_assert_eq(limit(NULL), 0);
}

Test(sysmem, v1_reads_the_memory_controller) {
    write_file("cgroup", "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n");
    write_file("fs/memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
    cr_assert_eq(limit(NULL), 1073741824ULL);
}

Test(sysmem, v1_unlimited_and_missing_files_are_no_limit) {
    write_file("cgroup", "11:memory:/\n");
    write_file("fs/memory/memory.limit_in_bytes", "9223372036854771712\n");
    cr_assert_eq(limit(NULL), 0);
    write_file("cgroup", "11:memory:/gone\n");
    cr_assert_eq(limit(NULL), 0, "falls back to the root, which is unlimited");
    cr_assert_eq(kf_cgroup_memory_limit("/nonexistent/cgroup", root, NULL, 0), 0);
    cr_assert_gt(kf_physical_memory_bytes(), 0);
}
