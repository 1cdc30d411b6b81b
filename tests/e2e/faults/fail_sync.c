/*
 * fail_sync.c - an LD_PRELOAD shim for end-to-end tests of the fail-stop
 * path: while the file named by $KEYFLOW_TEST_FAIL_SYNC_FILE exists, every
 * fsync and fdatasync of the process fails with EIO, as a dying disk's
 * would. RocksDB's WAL sync then fails, the real store reports it, and the
 * real engine fail-stops. Nothing else of the process is touched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

int fsync(int fd);
int fdatasync(int fd);

static int armed(void) {
    const char *path = getenv("KEYFLOW_TEST_FAIL_SYNC_FILE");
    return path != NULL && access(path, F_OK) == 0;
}

int fsync(int fd) {
    if (armed()) {
        errno = EIO;
        return -1;
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    if (armed()) {
        errno = EIO;
        return -1;
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
