#!/usr/bin/env python3
"""Import circles between the files of each crate of the workspace (issue 24).

Usage:
    python3 scripts/import-cycles.py              # every crate: the root package and crates/*
    python3 scripts/import-cycles.py CRATE_DIR..  # only these (directories holding src/)
    python3 scripts/import-cycles.py --inline     # also count paths in code (crate::x::Y)

Exit status: 0 when no crate has a circle, 1 when one does (each circle is printed with the
`use` paths that make it), 2 on a usage error.

What counts: file A imports file B when a `use` in A names an item B defines, resolved through
re-exports (`pub use`) to the defining file. A parent's pure re-export (`pub use child::X`
where the parent never names X itself) is the module's facade, not a dependency. Inline
modules (`mod tests { ... }`, `mod field { ... }`) are skipped, as are other crates' items and
macros. Text-based, without a parser: comments are stripped crudely, so a `//` inside a string
literal may hide the rest of its line. The Rust test tests/import_circles.rs checks a related
rule (paths in code too, ancestors exempt); this script is the quick one to run by hand.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

USE_RE = re.compile(r"(?:^|[;{}\s])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)
INLINE_MOD_RE = re.compile(r"(#\[cfg\(test\)\]\s*)?(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")
DEF_RE = re.compile(
    r"(?m)^(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|unsafe|async|extern\s+\"C\")\s+)*"
    r"(?:fn|struct|enum|trait|type|const|static|union|mod)\s+([A-Za-z_][A-Za-z0-9_]*)"
)


def strip_comments(s):
    """Removes block comments and, crudely, everything after `//` on a line."""
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in s.split("\n"))


def strip_inline_mods(s):
    """Removes the bodies of inline `mod x { ... }` (their `super::` is relative to them)."""
    out, i = "", 0
    while True:
        m = INLINE_MOD_RE.search(s, i)
        if not m:
            return out + s[i:]
        out += s[i : m.start()]
        j, depth = m.end(), 1
        while depth and j < len(s):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            j += 1
        i = j


def crate_files(root):
    """Module path (tuple of names; () for lib.rs/main.rs) -> file, for every .rs under src/."""
    src = os.path.join(root, "src")
    files = {}
    for dirpath, _, names in os.walk(src):
        for f in sorted(names):
            if not f.endswith(".rs"):
                continue
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                mod = ()
            elif rel[-1] == "mod":
                mod = tuple(rel[:-1])
            else:
                mod = tuple(rel)
            if mod == () and mod in files:
                continue  # a package with both lib.rs and main.rs: lib.rs wins
            files[mod] = p
    return files


def split_tree(s):
    """Splits a use tree's list at top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand(tree, prefix=()):
    """A use tree (`a::{b, c::d}`) -> its paths, as tuples."""
    tree = tree.strip()
    if tree.startswith("{") and tree.endswith("}"):
        return [p for t in split_tree(tree[1:-1]) for p in expand(t, prefix)]
    m = re.match(r"^(.*?)::\s*\{(.*)\}$", tree, re.S)
    if m:
        head = tuple(x.strip() for x in m.group(1).split("::") if x.strip())
        return [p for t in split_tree(m.group(2)) for p in expand(t, prefix + head)]
    tree = re.sub(r"\s+as\s+\w+$", "", tree)
    return [prefix + tuple(x.strip() for x in tree.split("::") if x.strip())]


def parse_file(path):
    """(uses as (is_pub, path), names defined, text) of one file."""
    s = strip_inline_mods(strip_comments(open(path, encoding="utf-8").read()))
    uses = [(bool(m.group(1)), p) for m in USE_RE.finditer(s) for p in expand(m.group(2))]
    defs = set(DEF_RE.findall(s)) | set(re.findall(r"macro_rules!\s*([A-Za-z_]\w*)", s))
    return uses, defs, s


def abs_path(mod, path):
    """`crate::`/`self::`/`super::` path seen from `mod` -> absolute; None for others."""
    segs = list(path)
    if not segs:
        return None
    if segs[0] == "crate":
        return tuple(segs[1:])
    if segs[0] in ("self", "super"):
        base = list(mod)
        while segs and segs[0] in ("self", "super"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
        return tuple(base) + tuple(segs)
    return None  # another crate, or a child module (handled by the caller)


def check_crate(root, inline=False):
    """Prints the crate's circles; returns how many there are."""
    files = crate_files(root)
    info = {m: parse_file(p) for m, p in files.items()}

    def resolve(ap, depth=0):
        """Absolute item path -> the files that define it (following `pub use`)."""
        for k in range(len(ap), -1, -1):
            if tuple(ap[:k]) in files:
                mod, rest = tuple(ap[:k]), ap[k:]
                break
        else:
            return set()
        if not rest or rest == ("*",) or depth > 6:
            return {mod}
        name = rest[0]
        uses, defs, _ = info[mod]
        if name in defs:
            return {mod}
        children = {m[-1] for m in files if m and m[:-1] == mod}
        for is_pub, path in uses:
            if not is_pub or path[-1] not in (name, "*"):
                continue
            a = abs_path(mod, path)
            if a is None:
                if path[0] not in children:
                    continue
                a = mod + path
            if path[-1] == "*":
                r = resolve(a[:-1] + (name,), depth + 1)
                if r and r != {a[:-1]}:
                    return r
                continue
            return resolve(a, depth + 1)
        return {mod}

    edges, why = defaultdict(set), defaultdict(list)
    for mod, (uses, _, s) in info.items():
        idents = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", USE_RE.sub(" ", s)))
        for is_pub, path in uses:
            a = abs_path(mod, path)
            if a is None:
                if path and mod + (path[0],) in files:
                    a = mod + path  # 2018 paths: `use child::x`
                else:
                    continue
            targets = set()
            if a[-1] == "*":
                if is_pub:
                    continue  # a glob re-export is a facade
                base = a[:-1]
                for tm in resolve(base) if base else {()}:
                    if tm != base:
                        continue
                    td = info[tm][1]
                    if (td & idents) - {x for x in td if tm + (x,) in files}:
                        targets.add(tm)
                    for n in idents - td:
                        r = resolve(base + (n,))
                        if r != {tm}:
                            targets |= r
            else:
                if is_pub and path[-1] not in idents and path[-1] != "self":
                    continue  # pure re-export (facade): not a dependency
                targets = resolve(a)
            for t in targets - {mod}:
                edges[mod].add(t)
                why[(mod, t)].append("::".join(path))
    if inline:
        for mod, (_, _, s) in info.items():
            for m in re.finditer(r"\b((?:crate|super|self)(?:::[A-Za-z_]\w*)+)", USE_RE.sub(" ", s)):
                a = abs_path(mod, tuple(m.group(1).split("::")))
                for t in resolve(a) - {mod} if a else ():
                    if t not in edges[mod]:
                        why[(mod, t)].append("in code: " + m.group(1))
                    edges[mod].add(t)

    # Tarjan's strongly connected components, iteratively.
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []
    for start in files:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                sccs.append(comp)

    def name(m):
        return os.path.relpath(files[m], root)

    bad = [c for c in sccs if len(c) > 1]
    n_edges = sum(len(v) for v in edges.values())
    print(f"== {root}: {len(files)} files, {n_edges} edges, {len(bad)} circles")
    for comp in bad:
        members = set(comp)
        print("  circle:", ", ".join(sorted(name(m) for m in comp)))
        for a in sorted(comp):
            for b in sorted(edges[a] & members):
                print(f"      {name(a)} -> {name(b)} via {sorted(set(why[(a, b)]))[:4]}")
    return len(bad)


def workspace_crates(top):
    """The root package (if it has src/) and every crates/* with a src/."""
    roots = [top] if os.path.isdir(os.path.join(top, "src")) else []
    crates = os.path.join(top, "crates")
    if os.path.isdir(crates):
        for d in sorted(os.listdir(crates)):
            if os.path.isdir(os.path.join(crates, d, "src")):
                roots.append(os.path.join(crates, d))
    return roots


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("crates", nargs="*", help="crate directories (default: the workspace's)")
    ap.add_argument("--inline", action="store_true", help="also count crate::/super:: paths in code")
    args = ap.parse_args()
    top = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    roots = args.crates or workspace_crates(top)
    circles = sum(check_crate(r, args.inline) for r in roots)
    print(f"{circles} circle(s) in {len(roots)} crate(s)")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
