"""End-to-end tests of what keyflowd's store costs on disk: an empty store is
a few MB (RocksDB used to preallocate about 70 MB for each WAL file and 4 MB
for its MANIFEST), also after a restart.

Run (Debian's Python):
  cd /work/main && KEYFLOW_BUILD_DIR=build PYENV_VERSION=system \
      python3 -m unittest discover -s tests/e2e -p 'test_storage_footprint.py' -v
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

# "A few MB": an empty store is about 0.3 MB today (OPTIONS files, the
# RocksDB info log, a MANIFEST); 8 MiB leaves room for RocksDB's own files
# without letting a preallocated WAL (about 70 MB) through.
EMPTY_STORE_BYTES_MAX = 8 * 1024 * 1024


def disk_bytes(path):
    """Bytes of disk the files under path occupy (allocated blocks, so that
    preallocated space counts although the file size does not show it)."""
    total = 0
    for base, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(base, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class StorageFootprintTest(unittest.TestCase):
    def setUp(self):
        self.server = harness.Keyflowd()
        self.addCleanup(self.server.cleanup)

    def db_dir(self):
        return os.path.join(self.server.data_dir, "db")

    def test_an_empty_store_takes_a_few_megabytes(self):
        self.server.start()
        size = disk_bytes(self.db_dir())
        self.assertLessEqual(size, EMPTY_STORE_BYTES_MAX,
                             "an empty store takes %d bytes on disk: %r"
                             % (size, {f: os.lstat(os.path.join(self.db_dir(), f)).st_blocks * 512
                                       for f in os.listdir(self.db_dir())}))
        # A restart opens a new WAL file and writes new OPTIONS: still small.
        self.assertEqual(self.server.stop(), 0)
        self.server.start()
        size = disk_bytes(self.db_dir())
        self.assertLessEqual(size, EMPTY_STORE_BYTES_MAX,
                             "after a restart, the empty store takes %d bytes" % size)


if __name__ == "__main__":
    unittest.main()
