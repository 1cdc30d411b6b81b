/*
 * version.h - what this binary is: the release version (CMake's project
 * version) and the source commit it was built from.
 *
 * The definitions are generated at build time (version.cmake) into a small
 * library that only the programs link (keyflowd, keyflow), so a new commit
 * relinks them and nothing else. The commit is `git describe --always
 * --dirty` of the source tree, the KF_COMMIT CMake variable when given (a
 * container build has no .git), or "unknown".
 */
#ifndef KF_BASE_VERSION_H
#define KF_BASE_VERSION_H

/* "0.1.0". Static storage. */
const char *kf_version(void);
/* "a1b2c3d", "a1b2c3d-dirty", or "unknown". Static storage. */
const char *kf_version_commit(void);

#endif
