"""`cmake --install` into a scratch prefix, then checks that what the deploy
files point at is installed: the binaries, the bash completion, and every
page the systemd unit's Documentation= names (file:///usr/share/doc/...,
looked up under the scratch prefix's share/doc).

  check_install.py BUILD_DIR SOURCE_DIR
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile


def main():
    build, source = sys.argv[1], sys.argv[2]
    prefix = tempfile.mkdtemp(prefix="kf-install-")
    problems = []
    try:
        p = subprocess.run(["cmake", "--install", build, "--prefix", prefix],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            print(p.stdout + p.stderr)
            return 1
        for path in ("bin/keyflowd", "bin/keyflow", "share/bash-completion/completions/keyflow"):
            if not os.path.isfile(os.path.join(prefix, path)):
                problems.append("not installed: " + path)
        with open(os.path.join(source, "deploy", "systemd", "keyflowd.service")) as f:
            unit = f.read()
        pages = [u for line in re.findall(r"^Documentation=(.*)$", unit, re.M)
                 for u in line.split()]
        if not pages:
            problems.append("the unit names no Documentation=")
        for page in pages:
            m = re.match(r"^file:///usr/(share/doc/.+)$", page)
            if m is None:
                if not re.match(r"^(man:|https?://)", page):
                    problems.append("Documentation=%s: not a file, man or web page" % page)
                continue
            if not os.path.isfile(os.path.join(prefix, m.group(1))):
                problems.append("Documentation=%s: cmake --install puts no file there" % page)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
