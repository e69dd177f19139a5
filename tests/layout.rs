//! Source layout rules for every crate in the workspace: no import circles between the files
//! of a crate (they tangle modules so that none can be understood or moved alone), and no
//! source file over 1,000 lines. Std only, so it also runs as a plain
//! `rustc --edition 2021 --test tests/layout.rs` binary from the repository root.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs;
use std::path::Path;

/// Source roots of the workspace's crates; a missing one is skipped.
const CRATE_ROOTS: &[&str] = &["src", "core/src", "engine/src", "hook/src"];
/// Besides the crate roots, where the line limit applies.
const OTHER_DIRS: &[&str] = &[
    "tests", "benches", "core/tests", "core/benches", "engine/tests", "engine/benches", "hook/tests", "hook/benches",
];
const MAX_LINES: usize = 1000;

fn repo_root() -> &'static Path {
    Path::new(option_env!("CARGO_MANIFEST_DIR").unwrap_or("."))
}

/// One file's reference into another file of the same crate.
#[derive(Debug, Clone, PartialEq)]
struct Edge {
    from: String,
    to: String,
    /// First line of `from` that makes the edge, and the path written there.
    line: usize,
    via: String,
}

// ---- lexing ----

/// Blanks comments and string/char literals, keeping line breaks so line numbers still match.
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, from: usize, to: usize| {
        for &ch in &c[from..to.min(c.len())] {
            out.push(if ch == '\n' { '\n' } else { ' ' });
        }
    };
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && at(i + 1) == '/' {
            let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
            blank(&mut out, i, end);
            i = end;
        } else if ch == '/' && at(i + 1) == '*' {
            let (mut j, mut depth) = (i + 2, 1);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && at(j + 1) == '*' {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && at(j + 1) == '/' {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if ch == '"' {
            let end = skip_quoted(&c, i + 1, '"');
            blank(&mut out, i, end);
            i = end;
        } else if ch == '\'' {
            // A char literal is `'\..'` or `'x'`; anything else is a lifetime or label.
            let end = if at(i + 1) == '\\' {
                skip_quoted(&c, i + 1, '\'')
            } else if at(i + 2) == '\'' {
                i + 3
            } else {
                out.push(ch);
                i += 1;
                continue;
            };
            blank(&mut out, i, end);
            i = end;
        } else if ch.is_alphabetic() || ch == '_' {
            let mut j = i;
            while j < c.len() && (c[j].is_alphanumeric() || c[j] == '_') {
                j += 1;
            }
            let word: String = c[i..j].iter().collect();
            let hashes = (j..c.len()).take_while(|&k| c[k] == '#').count();
            let end = match word.as_str() {
                "r" | "br" | "cr" if at(j + hashes) == '"' => {
                    let mut k = j + hashes + 1;
                    while k < c.len() && !(c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#')) {
                        k += 1;
                    }
                    k + 1 + hashes
                }
                "b" | "c" if at(j) == '"' => skip_quoted(&c, j + 1, '"'),
                "b" if at(j) == '\'' => skip_quoted(&c, j + 1, '\''),
                _ => {
                    out.push_str(&word);
                    i = j;
                    continue;
                }
            };
            blank(&mut out, i, end);
            i = end;
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

/// Index just past the closing `quote` of a literal whose body starts at `i`.
fn skip_quoted(c: &[char], mut i: usize, quote: char) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            ch if ch == quote => return i + 1,
            _ => i += 1,
        }
    }
    c.len()
}

/// Identifiers, `::`, and single punctuation characters, each with its line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let j = (i..c.len()).find(|&j| !(c[j].is_alphanumeric() || c[j] == '_')).unwrap_or(c.len());
            toks.push((c[i..j].iter().collect(), line));
            i = j;
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            toks.push(("::".to_string(), line));
            i += 2;
        } else {
            toks.push((ch.to_string(), line));
            i += 1;
        }
    }
    toks
}

// ---- scanning one file ----

/// A path written in a file: its line, its segments, and the inline modules it sits in.
struct Ref {
    line: usize,
    path: Vec<String>,
    inline: Vec<String>,
}

/// What a file declares (`mod x;`) and every path it writes.
struct Scan {
    mods: Vec<String>,
    refs: Vec<Ref>,
}

fn scan(src: &str) -> Scan {
    let toks = tokens(&strip(src));
    let tok = |i: usize| toks.get(i).map_or("", |t| t.0.as_str());
    let is_ident = |s: &str| s.starts_with(|c: char| c.is_alphabetic() || c == '_');
    let mut scan = Scan { mods: Vec::new(), refs: Vec::new() };
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        let here: Vec<String> = inline.iter().map(|m| m.0.clone()).collect();
        match tok(i) {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|m| m.1 == depth) {
                    inline.pop();
                }
            }
            "mod" if is_ident(tok(i + 1)) => {
                match tok(i + 2) {
                    ";" if inline.is_empty() => scan.mods.push(tok(i + 1).to_string()),
                    "{" => inline.push((tok(i + 1).to_string(), depth)),
                    _ => {}
                }
                i += 2;
                continue;
            }
            "use" if tok(i + 1) != "<" => {
                let mut paths = Vec::new();
                i = use_tree(&toks, i + 1, &mut Vec::new(), &mut paths);
                while !matches!(tok(i), ";" | "") {
                    i += 1;
                }
                scan.refs.extend(paths.into_iter().map(|(line, path)| Ref { line, path, inline: here.clone() }));
                continue;
            }
            // A path in code; `.name::<T>()` is a method call, not a path.
            t if is_ident(t) && tok(i + 1) == "::" && !matches!(tok(i.wrapping_sub(1)), "::" | ".") => {
                let line = toks[i].1;
                let mut path = vec![t.to_string()];
                i += 1;
                while tok(i) == "::" && is_ident(tok(i + 1)) {
                    path.push(tok(i + 1).to_string());
                    i += 2;
                }
                scan.refs.push(Ref { line, path, inline: here });
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// Parses the use tree at `i`, adding each full path under `prefix` (with the line where it
/// ends) to `out`; returns the index past the tree.
fn use_tree(toks: &[(String, usize)], mut i: usize, prefix: &mut Vec<String>, out: &mut Vec<(usize, Vec<String>)>) -> usize {
    let tok = |i: usize| toks.get(i).map_or("", |t| t.0.as_str());
    let base = prefix.len();
    if tok(i) == "::" {
        // `::name` is always another crate; an empty segment never resolves.
        prefix.push(String::new());
        i += 1;
    }
    loop {
        match tok(i) {
            "{" => {
                i += 1;
                while !matches!(tok(i), "}" | "") {
                    let next = use_tree(toks, i, prefix, out);
                    i = if tok(next) == "," { next + 1 } else { next.max(i + 1) };
                }
                i += 1;
            }
            "*" => {
                out.push((toks[i].1, prefix.clone()));
                i += 1;
            }
            t if t.starts_with(|c: char| c.is_alphabetic() || c == '_') => {
                let line = toks[i].1;
                prefix.push(t.to_string());
                i += 1;
                if tok(i) == "::" {
                    i += 1;
                    continue;
                }
                if tok(i) == "as" {
                    i += 2;
                }
                let mut path = prefix.clone();
                if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
                    path.pop();
                }
                out.push((line, path));
            }
            _ => {}
        }
        break;
    }
    prefix.truncate(base);
    i
}

// ---- module trees and edges ----

/// The module a written path points into, absolute from the crate root; None for another
/// crate (or a name this check does not follow).
fn resolve(path: &[String], here: &[String], modules: &HashMap<Vec<String>, usize>) -> Option<Vec<String>> {
    let first = path.first()?.as_str();
    let mut abs: Vec<String>;
    let mut rest = path;
    match first {
        "crate" => {
            abs = Vec::new();
            rest = &path[1..];
        }
        "self" | "super" => {
            abs = here.to_vec();
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "self" => {}
                    "super" => {
                        abs.pop()?;
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        // Since Rust 2018 a bare `child::x` names a child module of this one.
        _ => {
            abs = here.to_vec();
            abs.push(first.to_string());
            if !modules.contains_key(&abs) {
                return None;
            }
            abs.pop();
        }
    }
    abs.extend(rest.iter().cloned());
    Some(abs)
}

/// The files reachable from one crate root file, with their module paths.
fn module_tree(entry: &str, files: &HashMap<&str, &str>) -> Vec<(String, Vec<String>, Scan)> {
    let dir = entry.rsplit_once('/').map_or("", |d| d.0);
    let mut tree = Vec::new();
    let mut queue = VecDeque::from([(entry.to_string(), Vec::<String>::new(), dir.to_string())]);
    while let Some((path, module, dir)) = queue.pop_front() {
        let scan = scan(files[path.as_str()]);
        for name in &scan.mods {
            let child_dir = format!("{dir}/{name}");
            let candidates = [format!("{dir}/{name}.rs"), format!("{child_dir}/mod.rs")];
            if let Some(file) = candidates.into_iter().find(|f| files.contains_key(f.as_str())) {
                let mut child = module.clone();
                child.push(name.clone());
                queue.push_back((file, child, child_dir));
            }
        }
        tree.push((path, module, scan));
    }
    tree
}

/// Every file-to-file reference in the crate whose sources lie under `root`, one list per
/// module tree (the library, and each binary, which reaches the library by its name).
fn crate_edges(root: &str, files: &[(String, String)]) -> Vec<Vec<Edge>> {
    let files: HashMap<&str, &str> = files.iter().map(|(p, s)| (p.as_str(), s.as_str())).collect();
    let is_entry = |path: &&str| {
        let Some(rest) = path.strip_prefix(root).and_then(|r| r.strip_prefix('/')) else { return false };
        match rest.strip_prefix("bin/") {
            Some(bin) => (bin.ends_with(".rs") && !bin.contains('/')) || bin.split_once('/').is_some_and(|b| b.1 == "main.rs"),
            None => rest == "lib.rs" || rest == "main.rs",
        }
    };
    let mut entries: Vec<&str> = files.keys().copied().filter(is_entry).collect();
    entries.sort();
    entries
        .into_iter()
        .map(|entry| {
            let tree = module_tree(entry, &files);
            let modules: HashMap<Vec<String>, usize> = tree.iter().enumerate().map(|(i, t)| (t.1.clone(), i)).collect();
            let mut edges: Vec<Edge> = Vec::new();
            for (from, module, scan) in &tree {
                for r in &scan.refs {
                    let here: Vec<String> = module.iter().chain(&r.inline).cloned().collect();
                    let Some(abs) = resolve(&r.path, &here, &modules) else { continue };
                    let to = (0..=abs.len()).rev().find_map(|k| modules.get(&abs[..k])).map(|&t| &tree[t].0);
                    match to {
                        Some(to) if to != from && !edges.iter().any(|e| &e.from == from && &e.to == to) => edges.push(Edge {
                            from: from.clone(),
                            to: to.clone(),
                            line: r.line,
                            via: r.path.join("::"),
                        }),
                        _ => {}
                    }
                }
            }
            edges
        })
        .collect()
}

// ---- circles ----

/// Strongly connected components (Tarjan) of more than one file.
fn components(adj: &BTreeMap<&str, Vec<&str>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(v: &'a str, adj: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for &w in adj.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.stack.contains(&w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let at = s.stack.iter().rposition(|&x| x == v).unwrap();
            let scc: BTreeSet<String> = s.stack.drain(at..).map(str::to_string).collect();
            if scc.len() > 1 {
                s.found.push(scc);
            }
        }
    }
    let mut s = State { index: HashMap::new(), low: HashMap::new(), stack: Vec::new(), found: Vec::new() };
    for &v in adj.keys() {
        if !s.index.contains_key(v) {
            visit(v, adj, &mut s);
        }
    }
    s.found
}

/// One import circle: files that all reach each other, the shortest loop among them, and
/// the other imports inside the circle (any of which may keep it closed).
#[derive(Debug)]
struct Circle {
    files: usize,
    shortest: Vec<Edge>,
    others: Vec<Edge>,
}

fn circles(edges: &[Edge]) -> Vec<Circle> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in edges {
        adj.entry(&e.from).or_default().push(&e.to);
    }
    components(&adj)
        .iter()
        .map(|files| {
            let inner: Vec<&Edge> = edges.iter().filter(|e| files.contains(&e.from) && files.contains(&e.to)).collect();
            let shortest = files.iter().map(|f| shortest_loop(f, &inner)).min_by_key(Vec::len).unwrap();
            let others = inner.into_iter().filter(|e| !shortest.contains(e)).cloned().collect();
            Circle { files: files.len(), shortest, others }
        })
        .collect()
}

/// The shortest way from `start` back to itself (breadth first); `start` lies on a circle.
fn shortest_loop<'a>(start: &'a str, edges: &[&'a Edge]) -> Vec<Edge> {
    let mut prev: HashMap<&str, &Edge> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &e in edges.iter().filter(|e| e.from == v) {
            if !prev.contains_key(e.to.as_str()) {
                prev.insert(&e.to, e);
                queue.push_back(&e.to);
            }
        }
        if prev.contains_key(start) {
            break;
        }
    }
    let mut cycle = Vec::new();
    let mut v = start;
    loop {
        let e = prev[v];
        cycle.push(e.clone());
        v = &e.from;
        if v == start {
            break;
        }
    }
    cycle.reverse();
    cycle
}

fn crate_circles(root: &str, files: &[(String, String)]) -> Vec<Circle> {
    crate_edges(root, files).iter().flat_map(|edges| circles(edges)).collect()
}

fn describe(circle: &Circle) -> String {
    let line = |e: &Edge| format!("    {}:{} {} -> {}\n", e.from, e.line, e.via, e.to);
    let mut text = format!("circle through {} files; the shortest loop:\n", circle.files);
    text.extend(circle.shortest.iter().map(line));
    if !circle.others.is_empty() {
        text.push_str("  other imports inside this circle:\n");
        text.extend(circle.others.iter().map(line));
    }
    text
}

// ---- the real repository ----

/// `.rs` files under `dir` (relative to the repository root), skipping `target/`.
fn rust_files(dir: &str) -> Vec<(String, String)> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<(String, String)>) {
        let Ok(entries) = fs::read_dir(root.join(rel)) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}/{name}");
            if entry.path().is_dir() {
                if name != "target" {
                    walk(root, &path, out);
                }
            } else if name.ends_with(".rs") {
                out.push((path.clone(), fs::read_to_string(entry.path()).unwrap_or_else(|e| panic!("{path}: {e}"))));
            }
        }
    }
    let mut out = Vec::new();
    walk(repo_root(), dir, &mut out);
    out.sort();
    out
}

fn existing_roots() -> Vec<&'static str> {
    let roots: Vec<&str> = CRATE_ROOTS.iter().copied().filter(|r| repo_root().join(r).is_dir()).collect();
    // A wrong root directory must fail, not find nothing and pass.
    assert!(!roots.is_empty(), "no crate sources under {}", repo_root().display());
    roots
}

#[test]
fn no_import_circles_in_any_crate() {
    let mut report = String::new();
    let mut count = 0;
    for root in existing_roots() {
        let files = rust_files(root);
        assert!(files.iter().any(|f| f.0.ends_with("/lib.rs") || f.0.ends_with("/main.rs")), "{root} has no lib.rs or main.rs");
        for circle in crate_circles(root, &files) {
            count += 1;
            report.push_str(&describe(&circle));
        }
    }
    assert!(count == 0, "{count} import circles between files (each line: file:line path -> file it reaches):\n{report}");
}

#[test]
fn no_source_file_over_1000_lines() {
    let roots = existing_roots();
    let mut long: Vec<(usize, String)> = roots
        .iter()
        .chain(OTHER_DIRS)
        .flat_map(|dir| rust_files(dir))
        .map(|(path, text)| (text.lines().count(), path))
        .filter(|f| f.0 > MAX_LINES)
        .collect();
    long.sort_by(|a, b| b.cmp(a));
    let list: String = long.iter().map(|(n, p)| format!("    {p}: {n} lines\n")).collect();
    assert!(long.is_empty(), "{} files over {MAX_LINES} lines:\n{list}", long.len());
}

// ---- the checker's own tests ----

fn crate_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect()
}

fn edge_pairs(files: &[(&str, &str)]) -> Vec<(String, String)> {
    crate_edges("src", &crate_of(files)).concat().into_iter().map(|e| (e.from, e.to)).collect()
}

fn pair(from: &str, to: &str) -> (String, String) {
    (from.to_string(), to.to_string())
}

#[test]
fn checker_finds_two_file_circle() {
    let found = crate_circles(
        "src",
        &crate_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::X;\npub struct Y;\n"),
            ("src/b.rs", "pub struct X;\nfn f() -> crate::a::Y { todo!() }\n"),
        ]),
    );
    assert_eq!(found.len(), 1, "{found:?}");
    let text = describe(&found[0]);
    assert!(text.contains("src/a.rs:1 crate::b::X -> src/b.rs"), "{text}");
    assert!(text.contains("src/b.rs:2 crate::a::Y -> src/a.rs"), "{text}");
}

#[test]
fn checker_ignores_strings_and_comments() {
    let b = r####"pub struct X;
// use crate::a::Y;
/* crate::a::Y /* nested */ crate::a::Y */
/// crate::a::Y
const S: &str = "crate::a::Y \" crate::a::Y";
const R: &str = r#"crate::a::Y " crate::a::Y"#;
const B: &[u8] = b"crate::a::Y";
fn f<'a>(s: &'a str) -> [char; 3] { let _ = s; ['"', '\'', 'x'] }
const T: &str = "crate::a::Y";
"####;
    let files = [("src/lib.rs", "mod a;\nmod b;\n"), ("src/a.rs", "use crate::b::X;\npub struct Y;\n"), ("src/b.rs", b)];
    assert_eq!(edge_pairs(&files), [pair("src/a.rs", "src/b.rs")]);
    assert!(crate_circles("src", &crate_of(&files)).is_empty());
}

#[test]
fn checker_finds_mod_rs_reexport_circle() {
    let found = crate_circles(
        "src",
        &crate_of(&[
            ("src/lib.rs", "pub mod m;\n"),
            ("src/m/mod.rs", "mod child;\npub use child::Item;\npub struct Thing;\n"),
            ("src/m/child.rs", "use super::Thing;\npub struct Item(Thing);\n"),
        ]),
    );
    assert_eq!(found.len(), 1, "{found:?}");
    let mut files: Vec<&str> = found[0].shortest.iter().map(|e| e.from.as_str()).collect();
    files.sort();
    assert_eq!(files, ["src/m/child.rs", "src/m/mod.rs"]);
}

#[test]
fn checker_expands_nested_use_groups() {
    let files = [
        ("src/lib.rs", "mod x;\nmod y;\nmod z;\n"),
        ("src/x.rs", "pub struct A;\npub struct B;\n"),
        ("src/y.rs", ""),
        ("src/z.rs", "use crate::{\n    x::{A, B},\n    y,\n};\n"),
    ];
    assert_eq!(edge_pairs(&files), [pair("src/z.rs", "src/x.rs"), pair("src/z.rs", "src/y.rs")]);
    let edges = crate_edges("src", &crate_of(&files)).concat();
    assert_eq!((edges[0].line, edges[0].via.as_str()), (2, "crate::x::A"));
}

#[test]
fn checker_attributes_inline_test_module_to_its_file() {
    let files = [
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "pub struct T;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::b::Z;\n}\n"),
        ("src/b.rs", "pub struct Z;\n"),
    ];
    let edges = crate_edges("src", &crate_of(&files)).concat();
    assert_eq!(edges.len(), 1, "{edges:?}");
    assert_eq!((edges[0].from.as_str(), edges[0].to.as_str(), edges[0].line), ("src/a.rs", "src/b.rs", 5));
}

#[test]
fn checker_finds_three_file_circle() {
    let found = crate_circles(
        "src",
        &crate_of(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
            ("src/b.rs", "use crate::c::C;\npub struct B;\n"),
            ("src/c.rs", "pub struct C;\nfn f() { let _ = crate::a::A; }\n"),
        ]),
    );
    assert_eq!(found.len(), 1, "{found:?}");
    let mut files: Vec<&str> = found[0].shortest.iter().map(|e| e.from.as_str()).collect();
    files.sort();
    assert_eq!(files, ["src/a.rs", "src/b.rs", "src/c.rs"]);
}

#[test]
fn checker_resolves_to_the_longest_module_prefix() {
    // 2018 layout (`snapshot.rs` beside `snapshot/`), `self::`, `super::super`, a binary as its
    // own tree, and a file no module declares.
    let files = [
        ("src/lib.rs", "pub mod snapshot;\nfn f(_: crate::snapshot::model::Frame) {}\n"),
        ("src/snapshot.rs", "pub mod model;\npub use self::model::Frame;\npub fn read() {}\n"),
        ("src/snapshot/model.rs", "pub mod deep;\npub struct Frame;\nfn g() { crate::snapshot::read() }\n"),
        ("src/snapshot/model/deep.rs", "use super::super::read;\nuse vramscope::snapshot::model;\n"),
        ("src/main.rs", "mod cli;\nuse vramscope::snapshot;\n"),
        ("src/cli.rs", "use crate::Args;\n"),
        ("src/orphan.rs", "use crate::snapshot::read;\n"),
    ];
    assert_eq!(
        edge_pairs(&files),
        [
            pair("src/lib.rs", "src/snapshot/model.rs"),
            pair("src/snapshot.rs", "src/snapshot/model.rs"),
            pair("src/snapshot/model.rs", "src/snapshot.rs"),
            pair("src/snapshot/model/deep.rs", "src/snapshot.rs"),
            pair("src/cli.rs", "src/main.rs"),
        ]
    );
}
