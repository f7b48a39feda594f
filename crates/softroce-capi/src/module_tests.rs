//! The shape of this crate's source, read from its own `src/*.rs`: the files import each
//! other in no circle, no file reaches another through the crate root's re-exports (which
//! exist for the generated exports only), and no file is over 900 lines.
//!
//! File A imports file B when A's code (comments left out) names `crate::b`,
//! `crate::{…, b…}`, `super::b` or `b::…`. lib.rs, the crate root that declares the modules
//! and re-exports the entry points, is not a node.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// This file: its text names the patterns it looks for.
const SELF: &str = "module_tests";

/// Most lines a source file may have.
const MAX_LINES: usize = 900;

fn src_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Each `src/*.rs` as (module name, text).
fn sources() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(src_dir()).expect("read src/") {
        let path = entry.expect("a src/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a file name");
        let text = std::fs::read_to_string(&path).expect("read a source file");
        out.insert(name.to_string(), text);
    }
    out
}

/// The text without `//` comments (line comments; the crate has no block comments).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
    &s[..end]
}

/// The modules lib.rs declares, and the names lib.rs defines itself (functions, macros).
fn root(lib: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut modules, mut items) = (BTreeSet::new(), BTreeSet::new());
    for line in code(lib).lines().map(str::trim) {
        let line = line
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ");
        if let Some(rest) = line.strip_prefix("mod ")
            && line.ends_with(';')
        {
            modules.insert(ident(rest).to_string());
        } else if let Some(rest) = line.strip_prefix("fn ") {
            items.insert(ident(rest).to_string());
        } else if let Some(rest) = line.strip_prefix("macro_rules! ") {
            items.insert(ident(rest).to_string());
        }
    }
    (modules, items)
}

/// The first path segment of each entry of a `crate::{…}` group that starts at `s` (just
/// after the `{`), nested groups skipped.
fn group_heads(s: &str) -> Vec<&str> {
    let (mut heads, mut depth, mut at_entry) = (Vec::new(), 0usize, true);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_entry = true,
            c if at_entry && is_ident(c) => {
                heads.push(ident(&s[i..]));
                at_entry = false;
            }
            _ => {}
        }
    }
    heads
}

/// The modules file `code` imports, and the root re-exports it names (`crate::x` where `x`
/// is neither a module nor defined in lib.rs).
fn imports(
    code: &str,
    modules: &BTreeSet<String>,
    root_items: &BTreeSet<String>,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut uses, mut reexports) = (BTreeSet::new(), BTreeSet::new());
    let mut crate_name = |name: &str| {
        if modules.contains(name) {
            uses.insert(name.to_string());
        } else if !root_items.contains(name) && name != "self" {
            reexports.insert(name.to_string());
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => group_heads(group).into_iter().for_each(&mut crate_name),
            None => crate_name(ident(rest)),
        }
    }
    for (i, _) in code.match_indices("super::") {
        let name = ident(&code[i + "super::".len()..]);
        if modules.contains(name) {
            uses.insert(name.to_string());
        }
    }
    for (i, _) in code.match_indices("::") {
        let before = &code[..i];
        let start = before.rfind(|c: char| !is_ident(c)).map_or(0, |j| {
            j + before[j..].chars().next().map_or(1, char::len_utf8)
        });
        let name = &before[start..];
        let prev = before[..start].chars().next_back();
        if modules.contains(name) && prev != Some(':') {
            uses.insert(name.to_string());
        }
    }
    (uses, reexports)
}

/// A circle in `graph` (module → modules it imports), as the path that closes it.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

/// The import graph of `src/` (module → modules it imports), and the root re-exports each
/// file names.
fn graph() -> (
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<String, BTreeSet<String>>,
) {
    let files = sources();
    let (modules, root_items) = root(&files["lib"]);
    let (mut graph, mut reexports) = (BTreeMap::new(), BTreeMap::new());
    for (name, text) in files.iter().filter(|(n, _)| *n != "lib" && *n != SELF) {
        let (mut uses, names) = imports(&code(text), &modules, &root_items);
        uses.remove(name);
        graph.insert(name.clone(), uses);
        if !names.is_empty() {
            reexports.insert(name.clone(), names);
        }
    }
    (graph, reexports)
}

#[test]
fn files_import_each_other_in_no_circle() {
    let (graph, _) = graph();
    assert!(graph.contains_key("handle"), "src/ read: {graph:?}");
    if let Some(circle) = find_circle(&graph) {
        panic!(
            "import circle between files of softroce-capi: {}",
            circle.join(" -> ")
        );
    }
}

#[test]
fn files_name_other_files_by_module_not_through_the_root() {
    let (_, reexports) = graph();
    assert!(
        reexports.is_empty(),
        "files naming the crate root's re-exports (name the module instead): {reexports:?}"
    );
}

#[test]
fn the_handle_layer_depends_on_no_object_file() {
    let (graph, _) = graph();
    let uses = &graph["handle"];
    assert!(uses.is_empty(), "handle.rs imports {uses:?}");
}

#[test]
fn no_source_file_is_over_900_lines() {
    let long: Vec<_> = sources()
        .into_iter()
        .map(|(name, text)| (name, text.lines().count()))
        .filter(|&(_, n)| n > MAX_LINES)
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

// The checker itself: it sees each way of naming a module, and finds a circle.
#[test]
fn imports_sees_every_way_of_naming_a_module() {
    let modules: BTreeSet<String> = ["cq", "qp", "pd", "mw", "ah"].map(String::from).into();
    let root_items: BTreeSet<String> = ["ffi"].map(String::from).into();
    let text = "use crate::cq::Cq;\nuse crate::{ffi, pd::{Pd}, mw};\nlet x = super::ah::f();\n\
                let y = qp::post_send; // crate::nothing\nuse crate::ibv_create_qp;";
    let (uses, reexports) = imports(&code(text), &modules, &root_items);
    assert_eq!(
        uses,
        ["ah", "cq", "mw", "pd", "qp"].map(String::from).into()
    );
    assert_eq!(reexports, ["ibv_create_qp"].map(String::from).into());
}

#[test]
fn find_circle_finds_a_circle_and_only_a_circle() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for &(a, b) in edges {
            g.entry(a.into()).or_default().insert(b.into());
            g.entry(b.into()).or_default();
        }
        g
    };
    assert_eq!(find_circle(&g(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        find_circle(&g(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
}
