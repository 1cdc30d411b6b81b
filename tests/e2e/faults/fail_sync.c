/*
 * fail_sync.c - an LD_PRELOAD shim for end-to-end tests of what a disk
 * does to keyflowd; nothing else of the process is touched.
 *
 * - While the file named by $KEYFLOW_TEST_FAIL_SYNC_FILE exists, every
 *   fsync and fdatasync of the process fails with EIO, as a dying disk's
 *   would. RocksDB's WAL sync then fails, the real store reports it, and
 *   the real engine fail-stops.
 * - While the file named by $KEYFLOW_TEST_STALL_SYNC_FILE exists, every
 *   fsync and fdatasync waits for it to go, as a stuck disk would: the
 *   engines stop in their group commit and the calls sent meanwhile wait in
 *   front of them (test_grpc_limits.py).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int fsync(int fd);
int fdatasync(int fd);

static int exists(const char *variable) {
    const char *path = getenv(variable);
    return path != NULL && access(path, F_OK) == 0;
}

/* Returns -1 (EIO) when syncs fail now, else 0 once they may proceed. */
static int before_sync(void) {
    const struct timespec poll = {0, 10 * 1000 * 1000};
    while (exists("KEYFLOW_TEST_STALL_SYNC_FILE")) {
        nanosleep(&poll, NULL);
    }
    if (exists("KEYFLOW_TEST_FAIL_SYNC_FILE")) {
        errno = EIO;
        return -1;
    }
    return 0;
}

int fsync(int fd) {
    if (before_sync() != 0) {
        return -1;
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    if (before_sync() != 0) {
        return -1;
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
