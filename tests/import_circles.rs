//! No import circles between the files of a crate: file A imports file B when A names an item
//! that B defines, through `use` or a path in code (`super::b::X`, `crate::wire::X`, `b::X`),
//! resolved through re-exports (`pub use`) to the file that defines it. A circle (A imports B,
//! B imports A, or a longer ring) means a concept is split across files or a constant lives
//! in the wrong one (issue 24 item 5: BTH_LEN, MAX_CQE).
//!
//! What is not an import: a file naming its own ancestors' items (a child of `wire/mod.rs`
//! using `super::Error`), since a module's `mod.rs` is its facade; items of other crates;
//! macros. Text-based, with no parser: comments, strings and `#[cfg(test)] mod tests { … }`
//! blocks (inline tests come last in a file, STYLE.md §2) are skipped; an inline module
//! (`mod field { … }`) is part of its file. Crates in [`CHECKED`] must have no circle; the
//! ones in [`REPORTED`] (being rewritten) are only printed, with `--nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Source directories of the crates that must have no import circle. Extend it as the others
/// are cleaned up.
const CHECKED: &[&str] = &[
    "crates/softroce/src",
    "crates/softroce-ibverbs/src",
    "src",
    "crates/softroce-capi/src",
    "crates/softroce-rdmacm/src",
    "crates/softroce-cabi/src",
];

/// Source directories whose circles are printed but do not fail the test.
const REPORTED: &[&str] = &[];

type ModPath = Vec<String>;

#[derive(Default)]
struct File {
    rel: String,
    /// Imported names (`use a::b as c` → c ↦ a::b, absolute), with the line.
    aliases: BTreeMap<String, ModPath>,
    /// Glob imports (`use a::*` → a, absolute).
    globs: Vec<ModPath>,
    /// Names of items defined here (fn, struct, const, inline mod, ...).
    defined: BTreeSet<String>,
    /// Every path this file names (absolute), with the text it came from.
    refs: Vec<(ModPath, String)>,
}

/// Comments, string and char literals replaced by spaces (lifetimes kept).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' {
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c[i]);
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Other(char),
}

fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if c[i].is_alphabetic() || c[i] == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[s..i].iter().collect()));
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::Colons);
            i += 2;
        } else {
            if !c[i].is_whitespace() {
                out.push(Tok::Other(c[i]));
            }
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// Module path of a source file relative to `src/`.
fn mod_path(rel: &Path) -> ModPath {
    let mut v: ModPath = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = v.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs").to_string();
    if !(stem == "mod" || (v.is_empty() && (stem == "lib" || stem == "main"))) {
        v.push(stem);
    }
    v
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

struct Crate {
    files: BTreeMap<ModPath, File>,
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut paths = Vec::new();
        rs_files(src, &mut paths);
        let mods: BTreeSet<ModPath> = paths
            .iter()
            .map(|p| mod_path(p.strip_prefix(src).unwrap()))
            .collect();
        let mut files = BTreeMap::new();
        for p in &paths {
            let rel = p.strip_prefix(src).unwrap();
            let m = mod_path(rel);
            let text = std::fs::read_to_string(p).unwrap();
            let f = parse(&text, &m, &mods, rel.display().to_string());
            files.insert(m, f);
        }
        Crate { files }
    }

    /// The file that defines what `path` (absolute) names, if it is in this crate.
    fn resolve(&self, path: &[String], depth: usize) -> Option<ModPath> {
        if depth > 16 {
            return None;
        }
        let mut m: ModPath = Vec::new();
        for (i, seg) in path.iter().enumerate() {
            let mut child = m.clone();
            child.push(seg.clone());
            if self.files.contains_key(&child) {
                m = child;
                continue;
            }
            let f = self.files.get(&m)?;
            if f.defined.contains(seg) {
                return Some(m);
            }
            if let Some(target) = f.aliases.get(seg) {
                let mut p = target.clone();
                p.extend_from_slice(&path[i + 1..]);
                return self.resolve(&p, depth + 1);
            }
            for g in &f.globs {
                let names_it = self
                    .files
                    .get(g)
                    .is_some_and(|gf| gf.defined.contains(seg) || gf.aliases.contains_key(seg));
                if names_it {
                    let mut p = g.clone();
                    p.extend_from_slice(&path[i..]);
                    return self.resolve(&p, depth + 1);
                }
            }
            return Some(m);
        }
        Some(m)
    }

    /// Edges between files: (from, to) ↦ the first path that makes it.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), String> {
        let mut e = BTreeMap::new();
        for (m, f) in &self.files {
            for (p, text) in &f.refs {
                let Some(to) = self.resolve(p, 0) else {
                    continue;
                };
                // Naming yourself or an ancestor (the facade `mod.rs`) is no import.
                if to.len() <= m.len() && m[..to.len()] == to[..] {
                    continue;
                }
                e.entry((m.clone(), to)).or_insert_with(|| text.clone());
            }
        }
        e
    }

    /// The circles: every strongly connected set of two or more files, with its edges.
    fn circles(&self) -> Vec<Vec<String>> {
        let edges = self.edges();
        let nodes: Vec<&ModPath> = self.files.keys().collect();
        let idx: BTreeMap<&ModPath, usize> =
            nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
        let mut adj = vec![Vec::new(); nodes.len()];
        for (a, b) in edges.keys() {
            if let (Some(&x), Some(&y)) = (idx.get(a), idx.get(b)) {
                adj[x].push(y);
            }
        }
        // Tarjan's strongly connected components.
        struct T {
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            on: Vec<bool>,
            stack: Vec<usize>,
            next: usize,
            sccs: Vec<Vec<usize>>,
        }
        fn visit(v: usize, adj: &[Vec<usize>], t: &mut T) {
            t.index[v] = Some(t.next);
            t.low[v] = t.next;
            t.next += 1;
            t.stack.push(v);
            t.on[v] = true;
            for &w in &adj[v] {
                match t.index[w] {
                    None => {
                        visit(w, adj, t);
                        t.low[v] = t.low[v].min(t.low[w]);
                    }
                    Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                    _ => {}
                }
            }
            if Some(t.low[v]) == t.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = t.stack.pop() {
                    t.on[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                t.sccs.push(scc);
            }
        }
        let n = nodes.len();
        let mut t = T {
            index: vec![None; n],
            low: vec![0; n],
            on: vec![false; n],
            stack: Vec::new(),
            next: 0,
            sccs: Vec::new(),
        };
        for v in 0..n {
            if t.index[v].is_none() {
                visit(v, &adj, &mut t);
            }
        }
        let rel = |m: &ModPath| self.files[m].rel.clone();
        let mut out = Vec::new();
        for scc in t.sccs.into_iter().filter(|s| s.len() > 1) {
            let set: BTreeSet<&ModPath> = scc.iter().map(|&i| nodes[i]).collect();
            let mut lines = Vec::new();
            for ((a, b), text) in &edges {
                if set.contains(a) && set.contains(b) {
                    lines.push(format!("{} -> {} ({text})", rel(a), rel(b)));
                }
            }
            out.push(lines);
        }
        out
    }
}

/// `super`/`self`/`crate`/child-module paths made absolute; `None` for other crates' paths.
fn absolute(
    segs: &[String],
    here: &ModPath,
    mods: &BTreeSet<ModPath>,
    aliases: &BTreeMap<String, ModPath>,
) -> Option<ModPath> {
    let mut m = here.clone();
    let mut i = 0;
    match segs.first().map(String::as_str) {
        Some("crate") => {
            m.clear();
            i = 1;
        }
        Some("self") => i = 1,
        Some("super") => {
            while segs.get(i).map(String::as_str) == Some("super") {
                m.pop();
                i += 1;
            }
        }
        Some(first) => {
            let mut child = here.clone();
            child.push(first.to_string());
            if !mods.contains(&child) {
                let mut p = aliases.get(first)?.clone();
                p.extend_from_slice(&segs[1..]);
                return Some(p);
            }
        }
        None => return None,
    }
    m.extend_from_slice(&segs[i..]);
    Some(m)
}

/// Expands the use tree starting at `toks[*i]` into (alias, path) pairs and globs.
fn use_tree(
    toks: &[Tok],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(String, Vec<String>)>,
    globs: &mut Vec<Vec<String>>,
) {
    let mut path = prefix;
    loop {
        match toks.get(*i) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                *i += 1;
                if toks.get(*i) == Some(&Tok::Colons) {
                    *i += 1;
                    continue;
                }
                let mut alias = path.last().cloned().unwrap_or_default();
                if ident(toks.get(*i)) == Some("as") {
                    alias = ident(toks.get(*i + 1)).unwrap_or("_").to_string();
                    *i += 2;
                }
                if alias == "self" {
                    path.pop();
                    alias = path.last().cloned().unwrap_or_default();
                }
                out.push((alias, path));
                return;
            }
            Some(Tok::Other('*')) => {
                *i += 1;
                globs.push(path);
                return;
            }
            Some(Tok::Other('{')) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        Some(Tok::Other('}')) | None => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Other(',')) => *i += 1,
                        _ => use_tree(toks, i, path.clone(), out, globs),
                    }
                }
            }
            _ => return,
        }
    }
}

fn parse(text: &str, here: &ModPath, mods: &BTreeSet<ModPath>, rel: String) -> File {
    let mut src = strip(text);
    // Inline unit tests come last: drop them.
    if let Some(at) = src.find("#[cfg(test)]\nmod tests {") {
        src.truncate(at);
    }
    let toks = tokens(&src);
    let mut f = File {
        rel,
        ..File::default()
    };
    // Pass 1: definitions and use declarations.
    let mut uses: Vec<(String, Vec<String>)> = Vec::new();
    let mut globs: Vec<Vec<String>> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match ident(toks.get(i)) {
            Some("use") if toks.get(i + 1) != Some(&Tok::Other('<')) => {
                i += 1;
                if toks.get(i) == Some(&Tok::Colons) {
                    i += 1;
                }
                use_tree(&toks, &mut i, Vec::new(), &mut uses, &mut globs);
            }
            Some(
                "fn" | "struct" | "enum" | "const" | "static" | "type" | "trait" | "union" | "mod",
            ) => {
                if let Some(name) = ident(toks.get(i + 1)) {
                    f.defined.insert(name.to_string());
                }
                i += 1;
            }
            Some("macro_rules") => {
                if let Some(name) = ident(toks.get(i + 2)) {
                    f.defined.insert(name.to_string());
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    let no_aliases = BTreeMap::new();
    for (alias, p) in &uses {
        if let Some(abs) = absolute(p, here, mods, &no_aliases) {
            f.refs.push((abs.clone(), format!("use {}", p.join("::"))));
            f.aliases.insert(alias.clone(), abs);
        }
    }
    for g in &globs {
        if let Some(abs) = absolute(g, here, mods, &no_aliases) {
            f.refs
                .push((abs.clone(), format!("use {}::*", g.join("::"))));
            f.globs.push(abs);
        }
    }
    // Pass 2: paths in code (`a::b::c` outside use declarations).
    let mut i = 0;
    while i < toks.len() {
        if ident(toks.get(i)) == Some("use") {
            while i < toks.len() && toks[i] != Tok::Other(';') {
                i += 1;
            }
            continue;
        }
        if let Some(first) = ident(toks.get(i))
            && toks.get(i + 1) == Some(&Tok::Colons)
            && (i == 0 || toks[i - 1] != Tok::Colons)
        {
            let mut segs = vec![first.to_string()];
            let mut j = i + 1;
            while toks.get(j) == Some(&Tok::Colons) {
                match ident(toks.get(j + 1)) {
                    Some(s) => segs.push(s.to_string()),
                    None => break,
                }
                j += 2;
            }
            if let Some(abs) = absolute(&segs, here, mods, &f.aliases) {
                f.refs.push((abs, segs.join("::")));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    f
}

fn circles_of(dir: &str) -> Vec<Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    Crate::load(&root).circles()
}

#[test]
fn no_import_circle_between_the_files_of_a_checked_crate() {
    let mut bad = Vec::new();
    for dir in CHECKED {
        for c in circles_of(dir) {
            bad.push(format!("{dir}:\n  {}", c.join("\n  ")));
        }
    }
    assert!(bad.is_empty(), "import circles:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_finds_a_circle() {
    // opcode names bth's constant, bth names opcode's type through the facade.
    let mods: BTreeSet<ModPath> = [
        vec![],
        vec!["wire".into()],
        vec!["wire".into(), "a".into()],
        vec!["wire".into(), "b".into()],
    ]
    .into_iter()
    .collect();
    let m = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<ModPath>();
    let mut files = BTreeMap::new();
    files.insert(m(&[]), parse("mod wire;", &m(&[]), &mods, "lib.rs".into()));
    files.insert(
        m(&["wire"]),
        parse(
            "mod a; mod b; pub use a::A; pub use b::{B, LEN};",
            &m(&["wire"]),
            &mods,
            "wire/mod.rs".into(),
        ),
    );
    files.insert(
        m(&["wire", "a"]),
        parse(
            "use super::{B, Error};\npub struct A(B);",
            &m(&["wire", "a"]),
            &mods,
            "wire/a.rs".into(),
        ),
    );
    files.insert(
        m(&["wire", "b"]),
        parse(
            "pub struct B;\npub const LEN: usize = super::a::SIZE; // a::X in a comment",
            &m(&["wire", "b"]),
            &mods,
            "wire/b.rs".into(),
        ),
    );
    let c = Crate { files };
    assert_eq!(
        c.circles(),
        [vec![
            "wire/a.rs -> wire/b.rs (use super::B)".to_string(),
            "wire/b.rs -> wire/a.rs (super::a::SIZE)".to_string(),
        ]]
    );
}

/// The crates being rewritten: their circles, printed (`cargo test --test import_circles --
/// --nocapture`), not failed.
#[test]
fn import_circles_of_the_crates_being_rewritten_are_listed() {
    for dir in REPORTED {
        let c = Crate::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir));
        let circles = c.circles();
        println!(
            "{dir}: {} files, {} imports between them, {} circle(s)",
            c.files.len(),
            c.edges().len(),
            circles.len()
        );
        for c in circles {
            println!("  {}", c.join("\n  "));
        }
    }
}
