#!/usr/bin/env python3
"""The file-level import graph of src/, its cycles and its layer breaches.

`python3 tools/import-cycles.py [src]` prints every import cycle (a strongly connected component
of more than one file, inside a folder too) and every import that goes against the layers of
docs/architecture.md (a layer may use the layers above it, never the ones below; the drivers
sim and net never use each other). Exits 1 when it found either; `tests/layers.rs` runs
it in the test suite.

An edge is any path that names another file: `use` trees with their groups expanded
(`use super::{a::B, c}` names a and c), `crate::…`/`super::…`/`self::…` paths in code, and a
folder module's `mod x;` is not an edge (declaring is not using). Test code (`tests.rs`,
`#[cfg(test)] mod … {}` blocks) and comments are left out.
"""
import os
import re
import sys

# Top-level modules by layer, top (0) to bottom; docs/architecture.md draws the same picture.
LAYERS = [
    {"ids", "store", "datasets", "testkit"},
    {"core", "coord", "privacy"},
    {"learn"},
    {"trace"},
    {"faults"},
    {"scenario"},
    {"silo"},
    {"protocol", "report"},
    {"sim", "net"},
    {"launch", "suite"},
    {"cli"},
]
# Drivers: same layer, never each other.
DRIVERS = {"sim", "net"}
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def files_of(root):
    files = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith(".rs"):
                continue
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            is_dir = rel[-1] in ("mod", "lib", "main")
            if is_dir:
                rel = rel[:-1]
            files[tuple(rel)] = (p, is_dir)
    return files


def strip(src):
    """Comments, strings and test modules out."""
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r'r#*"(?:.|\n)*?"#*', '""', src)
    src = re.sub(r'"(?:[^"\\]|\\.)*"', '""', src)
    src = re.sub(r"'(?:[^'\\]|\\.)'", "' '", src)
    out = []
    i = 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", src):
        if m.start() < i:
            continue
        out.append(src[i : m.start()])
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        i = j
    out.append(src[i:])
    return "".join(out)


def expand(tree):
    """`a::{b::C, d}` → [[a, b, C], [a, d]] (`self` in a group names the prefix)."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def go(prefix, s):
        if "{" not in s:
            s = re.sub(r"\bas\w+$", "", s.split(" as ")[0])
            path = [x for x in s.split("::") if x]
            if path == ["self"]:
                return [prefix]
            return [prefix + path]
        head, rest = s.split("{", 1)
        rest = rest[: rest.rfind("}")]
        base = prefix + [x for x in head.split("::") if x]
        out = []
        for part in split_top(rest):
            out += go(base, part)
        return out

    return go([], tree)


def module_paths(src):
    """Every module path the code names: use trees expanded, and crate/super/self paths."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", src):
        paths += expand(m.group(1))
    body = re.sub(r"\buse\s+[^;]+;", "", src)
    for m in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", body):
        paths.append([m.group(1)] + m.group(2).strip(":").split("::"))
    return paths


def resolve(files, base, parts, reexports=None, depth=0):
    """The file a path from module `base` names (longest prefix that is a file), or None. A
    name the file only re-exports (`pub use x::Name`) resolves to where it comes from."""
    if not parts:
        return None
    if parts[0] == "crate":
        cur, parts = [], parts[1:]
    elif parts[0] in ("super", "self"):
        cur = list(base)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                cur = cur[:-1]
            parts = parts[1:]
    else:
        # A relative path (`use x::Y` of a child or an extern crate): a child module only.
        cur = list(base)
        if tuple(cur + parts[:1]) not in files:
            return None
    full = cur + parts
    for n in range(len(full), -1, -1):
        t = tuple(full[:n])
        if t not in files:
            continue
        rest = full[n:]
        if reexports and rest and depth < 8 and rest[0] in reexports.get(t, {}):
            target = resolve(files, list(t), reexports[t][rest[0]], reexports, depth + 1)
            if target is not None:
                return target
        return t
    return None


def reexports_of(files):
    """Each file's `pub use` names: name → the path it re-exports (relative to the file)."""
    out = {}
    for mod, (p, is_dir) in files.items():
        src = strip(open(p, encoding="utf-8").read())
        names = {}
        for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", src):
            for path in expand(m.group(1)):
                if path and path[-1] not in ("*", "self"):
                    names[path[-1]] = path
        # `super` inside a re-export is relative to the file's own module.
        out[mod] = names
    return out


def graph(root):
    files = files_of(root)
    reexports = reexports_of(files)
    edges = {k: set() for k in files}
    for mod, (p, is_dir) in files.items():
        if os.path.basename(p) == "tests.rs":
            continue
        src = strip(open(p, encoding="utf-8").read())
        # `super` of a file module is its folder's module; of a folder module, the parent's.
        base = list(mod) if is_dir else list(mod[:-1]) + [mod[-1]]
        for parts in module_paths(src):
            t = resolve(files, base, parts, reexports)
            # A module's own ancestors reached as a path prefix are not imports.
            if t is None or t == mod or t == () or mod[: len(t)] == t:
                continue
            edges[mod].add(t)
    return edges


def cycles(edges):
    sys.setrecursionlimit(100000)
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]

    def sc(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        st.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in idx:
                sc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in idx:
            sc(v)
    return out


def breaches(edges):
    out = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            ta, tb = a[0] if a else "", b[0] if b else ""
            if ta == tb or ta not in RANK or tb not in RANK:
                continue
            if RANK[tb] > RANK[ta] or (RANK[tb] == RANK[ta] and (ta in DRIVERS or tb in DRIVERS)):
                out.append((a, b))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    edges = graph(root)
    cyc = cycles(edges)
    brs = breaches(edges)
    name = lambda m: "/".join(m) or "lib"
    for comp in cyc:
        print(f"cycle of {len(comp)}: " + " ".join(name(m) for m in comp))
    for a, b in brs:
        print(f"layer breach: {name(a)} uses {name(b)}")
    unknown = sorted({m[0] for m in edges if m and m[0] not in RANK})
    print(
        f"{len(edges)} files, {sum(len(e) for e in edges.values())} imports, "
        f"{len(cyc)} cycles, {len(brs)} layer breaches"
        + (f" (not in a layer: {', '.join(unknown)})" if unknown else "")
    )
    sys.exit(1 if cyc or brs else 0)


if __name__ == "__main__":
    main()
