"""Holds every #include of the C sources to the layers in layers.txt.

    check_layers.py ROOT       check the tree at ROOT; exit 1 and name each
                               offending include
    check_layers.py --self-test
                               check that a wrong include in a small made-up
                               tree is reported (so this check can fail)

A quoted include is resolved like the compiler does (the including file's
folder, then the `roots` of layers.txt), or, when it is generated into the
build tree, by the path it is included as (the `generated` lines). An
angle-bracket include is checked against the `foreign` lines, and, when it
names a file of the tree through the `roots` (the compiler finds
<rpc/grpc_server.h> there too), like a quoted one. Every .c/.h file under a
layer folder is checked; one outside every layer folder (and outside
tests/) is an error too, so a new folder must be given a layer. So are an
include of anything but a header (its own includes would not be checked)
and a computed `#include MACRO`, which this check cannot follow.
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
DIRECTIVE = re.compile(r'^\s*#\s*include\b\s*(\S?)', re.M)
UNCHECKED = ("tests",)  # tests may reach into the layer they test


def skipped(root, rel_dir, name):
    """Folders that hold no layer's code: tests, hidden ones, dependencies
    (node_modules) and build trees (a CMakeCache.txt, whatever the name)."""
    rel = os.path.join(rel_dir, name)
    return (rel in UNCHECKED or name.startswith(".") or name == "node_modules"
            or os.path.exists(os.path.join(root, rel, "CMakeCache.txt")))


def parse_layers(text):
    """layers.txt as (uses by layer, layer by folder, roots, generated, foreign)."""
    layers, folders, roots, generated, foreign = {}, {}, [], [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p.split() for p in line.split(":")]
        if len(parts) not in (2, 3) or len(parts[0]) != 1:
            raise SystemExit(f"layers.txt:{number}: want `name : words [: words]`")
        kind = parts[0][0]
        if kind == "roots":
            roots = ["" if r == "." else r for r in parts[1]]
        elif kind == "generated":
            generated.append((parts[1][0], parts[2][0]))
        elif kind == "foreign":
            foreign.append((parts[1][0], set(parts[2])))
        else:
            layers[kind] = set(parts[2])
            for d in parts[1]:
                folders[d.rstrip("/")] = kind
    for name, uses in layers.items():
        unknown = uses - layers.keys()
        if unknown:
            raise SystemExit(f"layers.txt: {name} uses unknown layers {sorted(unknown)}")
    return layers, folders, roots, generated, foreign


def layer_of(path, folders):
    """The layer of a file (a path relative to the root), or None."""
    best = None
    for folder, name in folders.items():
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best[0]):
                best = (folder, name)
    return best[1] if best else None


def check(root):
    with open(os.path.join(root, "layers.txt")) as f:
        layers, folders, roots, generated, foreign = parse_layers(f.read())
    problems = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [d for d in dirnames if not skipped(root, rel_dir, d)]
        for name in sorted(filenames):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(rel_dir, name)
            layer = layer_of(path, folders)
            if layer is None:
                problems.append(f"{path}: in no layer of layers.txt")
                continue
            with open(os.path.join(root, path), errors="replace") as f:
                text = f.read()
            for m in DIRECTIVE.finditer(text):
                if m.group(1) not in ('"', "<"):
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append(f"{path}:{line}: a computed #include, which this check "
                                    "cannot follow: name the header")
            for m in INCLUDE.finditer(text):
                kind, target = m.groups()
                line = text.count("\n", 0, m.start()) + 1
                where = f"{path}:{line}: {layer} includes {kind}{target}{'>' if kind == '<' else kind}"
                if kind == "<":
                    for prefix, allowed in foreign:
                        if target.startswith(prefix) and layer not in allowed:
                            problems.append(f"{where}, which only {', '.join(sorted(allowed))} "
                                            "may use")
                    if not in_tree(root, roots, target):
                        continue  # a system or dependency header
                elif not target.endswith(".h"):
                    problems.append(f"{where}, which is not a header: its includes would not "
                                    "be checked")
                    continue
                search = roots if kind == "<" else [rel_dir] + roots
                target_layer = resolve(root, search, target, folders, generated)
                if target_layer is None:
                    problems.append(f"{where}, which is in no layer (or does not exist)")
                elif target_layer != layer and target_layer not in layers[layer]:
                    problems.append(f"{where}, of layer {target_layer}, which {layer} may not use")
    return problems


def in_tree(root, roots, target):
    """Whether an include names a file of the tree through the roots."""
    return any(os.path.isfile(os.path.join(root, os.path.normpath(os.path.join(base, target))))
               for base in roots)


def resolve(root, search, target, folders, generated):
    """The layer of the file an include names, or None."""
    for base in search:
        candidate = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, candidate)):
            return layer_of(candidate, folders)
    if target.endswith(".pb-c.h"):
        for prefix, name in generated:
            if target.startswith(prefix):
                return name
    return None


def self_test():
    files = {
        "layers.txt": "low : service/low :\nhigh : service/high : low\nroots : service\n"
                      "foreign : zlib : low\n",
        "service/low/a.h": "",
        "service/low/b.c": '#include "low/a.h"\n#include "high/c.h"\n#include <zlib.h>\n',
        "service/high/c.h": '#include "low/a.h"\n#include <zlib.h>\n',
        "service/stray/d.c": "",
        "service/low/e.c": '#include <high/c.h>\n#define H "high/c.h"\n#include H\n',
        "service/low/f.inc": '#include "high/c.h"\n',
        "service/low/g.c": '#include "f.inc"\n',
    }
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        found = check(root)
    want = ['service/low/b.c:2: low includes "high/c.h", of layer high',
            "service/high/c.h:2: high includes <zlib.h>, which only low may use",
            "service/stray/d.c: in no layer",
            "service/low/e.c:1: low includes <high/c.h>, of layer high",
            "service/low/e.c:3: a computed #include",
            'service/low/g.c:1: low includes "f.inc", which is not a header']
    missing = [w for w in want if not any(p.startswith(w) for p in found)]
    if missing or len(found) != len(want):
        print("self-test failed; reported:", *found, "expected:", *want, sep="\n  ")
        return 1
    print(f"self-test: the {len(want)} wrong includes were reported")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    problems = check(argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) break layers.txt")
        return 1
    print("every include follows layers.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
