//! The crate's structure, read from its own imports: no two files of `src/` may import
//! each other in a circle, and at most five imports may run from a lower level of the
//! module map to a higher one.
//!
//! A room is one top-level module (`src/x.rs` or the folder `src/x/`; the binaries in
//! `src/main.rs` and `src/bin/` are rooms of their own). An arrow is a `crate::`,
//! `super::`, `self::` or `rkubelet::` path in one file that names another file's module,
//! test modules included. Rooms are ordered so that as few arrows as possible run back
//! up; those that do are listed. Run with `-- --nocapture` to print the map.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most imports that may run from a lower level up to a higher one.
const MAX_UPWARD: usize = 5;

/// One source file: its module path inside its crate, and which crate.
#[derive(Debug, Clone)]
struct SourceFile {
    path: String,
    /// `None` for the library, `Some(root)` for a binary rooted at that file's folder.
    bin: Option<String>,
    module: Vec<String>,
    room: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn describe(rel: &str) -> SourceFile {
    let parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
    // parts[0] == "src"
    let (bin, module, room) = match parts.as_slice() {
        ["src", "main"] => (Some("main".to_string()), vec![], "main".to_string()),
        ["src", "bin", name] => (Some(name.to_string()), vec![], "bin".to_string()),
        ["src", "bin", name, rest @ ..] => {
            let mut m: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            if m.last().is_some_and(|l| l == "main" || l == "mod") {
                m.pop();
            }
            (Some(name.to_string()), m, "bin".to_string())
        }
        ["src", "lib"] => (None, vec![], "lib".to_string()),
        ["src", rest @ ..] => {
            let mut m: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            if m.last().is_some_and(|l| l == "mod") {
                m.pop();
            }
            let room = m[0].clone();
            (None, m, room)
        }
        _ => panic!("not a source path: {rel}"),
    };
    SourceFile {
        path: rel.to_string(),
        bin,
        module,
        room,
    }
}

/// The text with comments, string and char literals blanked out (lengths kept).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // raw string r"..." / r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            j = (j + close.len()).min(b.len());
            for &c in &b[i..j] {
                out.push(if c == b'\n' { b'\n' } else { b' ' });
            }
            i = j;
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' {
            // a char literal ('x', '\n', '\u{..}'), not a lifetime ('a)
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(b' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push(b'\'');
                    i += 1;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("ascii-preserving strip")
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path, // ::
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

fn tokens(s: &str) -> Vec<Tok> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let st = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(s[st..i].to_string()));
            continue;
        }
        match c {
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push(Tok::Path);
                i += 2;
                continue;
            }
            b'{' => out.push(Tok::Open),
            b'}' => out.push(Tok::Close),
            b',' => out.push(Tok::Comma),
            b';' => out.push(Tok::Semi),
            b'*' => out.push(Tok::Star),
            c if c.is_ascii_whitespace() => {}
            _ => out.push(Tok::Other),
        }
        i += 1;
    }
    out
}

/// Expands a `use` tree starting at `toks[i]` into full paths; returns the index after it.
fn use_tree(toks: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(id)) if id == "as" => {
                i += 2; // `as name`
                out.push(path);
                return i;
            }
            Some(Tok::Ident(id)) => {
                path.push(id.clone());
                i += 1;
            }
            Some(Tok::Path) => i += 1,
            Some(Tok::Star) => {
                out.push(path);
                return i + 1;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, &path, out),
                    }
                }
            }
            _ => {
                out.push(path);
                return i;
            }
        }
    }
}

/// Every module path the file names (`use` trees and inline paths), made absolute within
/// its crate. Paths into this crate's library from a binary start with `rkubelet`.
fn referenced_paths(file: &SourceFile, text: &str) -> Vec<(bool, Vec<String>)> {
    let toks = tokens(&strip(text));
    let mut found = Vec::new();
    // inline `mod name {` blocks: (name, brace depth at which it closes)
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(m)
                if m == "mod"
                    && matches!(toks.get(i + 1), Some(Tok::Ident(_)))
                    && toks.get(i + 2) == Some(&Tok::Open) =>
            {
                if let Some(Tok::Ident(name)) = toks.get(i + 1) {
                    inline.push((name.clone(), depth));
                }
                depth += 1;
                i += 3;
                continue;
            }
            _ => {}
        }
        let here: Vec<String> = file
            .module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        let starts_path = |t: &Tok| matches!(t, Tok::Ident(id) if id == "crate" || id == "super" || id == "self" || id == "rkubelet");
        let prev_is_path = i > 0 && toks[i - 1] == Tok::Path;
        if let Tok::Ident(kw) = &toks[i]
            && kw == "use"
        {
            let mut paths = Vec::new();
            let next = use_tree(&toks, i + 1, &[], &mut paths);
            for p in paths {
                if let Some(abs) = absolute(&here, &p) {
                    found.push(abs);
                }
            }
            i = next.max(i + 1);
            continue;
        }
        if starts_path(&toks[i]) && !prev_is_path && toks.get(i + 1) == Some(&Tok::Path) {
            let mut p = Vec::new();
            let mut j = i;
            while let Some(Tok::Ident(id)) = toks.get(j) {
                p.push(id.clone());
                if toks.get(j + 1) == Some(&Tok::Path) {
                    j += 2;
                } else {
                    j += 1;
                    break;
                }
            }
            if let Some(abs) = absolute(&here, &p) {
                found.push(abs);
            }
            i = j;
            continue;
        }
        i += 1;
    }
    found
}

/// (into the library?, absolute module path) for a path as written in module `here`.
fn absolute(here: &[String], p: &[String]) -> Option<(bool, Vec<String>)> {
    let first = p.first()?;
    match first.as_str() {
        "crate" => Some((false, p[1..].to_vec())),
        "rkubelet" => Some((true, p[1..].to_vec())),
        "self" => Some((false, here.iter().chain(&p[1..]).cloned().collect())),
        "super" => {
            let mut base = here.to_vec();
            let mut k = 0;
            while p.get(k).is_some_and(|s| s == "super") {
                base.pop()?;
                k += 1;
            }
            Some((
                false,
                base.into_iter().chain(p[k..].iter().cloned()).collect(),
            ))
        }
        _ => None,
    }
}

struct Graph {
    files: Vec<SourceFile>,
    /// file index -> file index -> number of paths naming it
    edges: BTreeMap<usize, BTreeMap<usize, usize>>,
}

fn read_graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    rust_files(&root.join("src"), &mut paths);
    let files: Vec<SourceFile> = paths
        .iter()
        .map(|p| describe(&p.strip_prefix(root).expect("under root").to_string_lossy()))
        .collect();
    let find = |bin: &Option<String>, module: &[String]| -> Option<usize> {
        // the longest prefix of `module` that is a file of that crate
        (0..=module.len()).rev().find_map(|n| {
            files
                .iter()
                .position(|f| &f.bin == bin && f.module.as_slice() == &module[..n])
        })
    };
    let mut edges: BTreeMap<usize, BTreeMap<usize, usize>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(root.join(&f.path)).expect("read source");
        for (into_lib, module) in referenced_paths(f, &text) {
            let crate_of = if into_lib { None } else { f.bin.clone() };
            if module.is_empty() {
                continue; // the crate root itself (`use crate::{a, b}` is expanded)
            }
            if let Some(j) = find(&crate_of, &module)
                && j != i
                && !(files[j].module.is_empty())
            {
                *edges.entry(i).or_default().entry(j).or_default() += 1;
            }
        }
    }
    Graph { files, edges }
}

/// Strongly connected components (Tarjan), each sorted; only those of more than one node.
fn circles(nodes: &[usize], adj: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    struct T<'a> {
        adj: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: BTreeMap<usize, usize>,
        low: BTreeMap<usize, usize>,
        stack: Vec<usize>,
        on: BTreeSet<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T, v: usize) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let succ: Vec<usize> = t
            .adj
            .get(&v)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(&v).expect("low");
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(&v).expect("low");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[&v] == t.index[&v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().expect("stack");
                t.on.remove(&w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &n in nodes {
        if !t.index.contains_key(&n) {
            visit(&mut t, n);
        }
    }
    t.out
}

/// Orders the rooms bottom-up so that few arrows run back up (the greedy order of Eades,
/// Lin and Smyth, weighted by how many file imports each arrow carries), then gives each
/// room a level: one above the highest room it imports along the order.
fn levels(
    rooms: &[String],
    weight: &BTreeMap<(usize, usize), usize>,
) -> (BTreeMap<usize, usize>, Vec<(usize, usize)>) {
    let mut left: BTreeSet<usize> = (0..rooms.len()).collect();
    let (mut bottom, mut top) = (Vec::new(), Vec::new());
    let out_w = |v: usize, left: &BTreeSet<usize>| -> usize {
        weight
            .iter()
            .filter(|((a, b), _)| *a == v && left.contains(b))
            .map(|(_, w)| w)
            .sum()
    };
    let in_w = |v: usize, left: &BTreeSet<usize>| -> usize {
        weight
            .iter()
            .filter(|((a, b), _)| *b == v && left.contains(a))
            .map(|(_, w)| w)
            .sum()
    };
    while !left.is_empty() {
        // a room that imports nothing left goes to the bottom; one nothing imports, to the top
        if let Some(&v) = left.iter().find(|&&v| out_w(v, &left) == 0) {
            left.remove(&v);
            bottom.push(v);
            continue;
        }
        if let Some(&v) = left.iter().find(|&&v| in_w(v, &left) == 0) {
            left.remove(&v);
            top.push(v);
            continue;
        }
        let &v = left
            .iter()
            .max_by_key(|&&v| {
                (
                    in_w(v, &left) as i64 - out_w(v, &left) as i64,
                    std::cmp::Reverse(v),
                )
            })
            .expect("non-empty");
        // most imported, least importing: lowest of what is left
        left.remove(&v);
        bottom.push(v);
    }
    let order: Vec<usize> = bottom.into_iter().chain(top.into_iter().rev()).collect();
    let pos: BTreeMap<usize, usize> = order.iter().enumerate().map(|(p, &v)| (v, p)).collect();
    let mut level = BTreeMap::new();
    for &v in &order {
        let l = weight
            .keys()
            .filter(|(a, b)| *a == v && pos[b] < pos[&v])
            .map(|(_, b)| level[b] + 1)
            .max()
            .unwrap_or(1);
        level.insert(v, l);
    }
    let upward = weight
        .keys()
        .filter(|(a, b)| pos[b] > pos[a])
        .copied()
        .collect();
    (level, upward)
}

#[test]
fn no_circles_and_few_imports_run_back_up() {
    let g = read_graph();
    // file level
    let nodes: Vec<usize> = (0..g.files.len()).collect();
    let adj: BTreeMap<usize, BTreeSet<usize>> = g
        .edges
        .iter()
        .map(|(a, m)| (*a, m.keys().copied().collect()))
        .collect();
    let file_circles = circles(&nodes, &adj);
    // room level
    let rooms: Vec<String> = g
        .files
        .iter()
        .filter(|f| f.room != "lib")
        .map(|f| f.room.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let room_of = |f: usize| rooms.iter().position(|r| *r == g.files[f].room);
    let mut weight: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut why: BTreeMap<(usize, usize), Vec<String>> = BTreeMap::new();
    for (a, m) in &g.edges {
        for (b, n) in m {
            if let (Some(ra), Some(rb)) = (room_of(*a), room_of(*b))
                && ra != rb
            {
                *weight.entry((ra, rb)).or_default() += n;
                why.entry((ra, rb))
                    .or_default()
                    .push(format!("{} -> {}", g.files[*a].path, g.files[*b].path));
            }
        }
    }
    let (level, upward) = levels(&rooms, &weight);
    let floors = level.values().max().copied().unwrap_or(0);

    println!(
        "{} files, {} modules on {} levels",
        g.files.len(),
        rooms.len(),
        floors
    );
    for l in (1..=floors).rev() {
        let here: Vec<&str> = level
            .iter()
            .filter(|(_, x)| **x == l)
            .map(|(r, _)| rooms[*r].as_str())
            .collect();
        println!("  level {l:2}: {}", here.join(", "));
    }
    println!("{} imports run back up:", upward.len());
    for e in &upward {
        println!("  {} -> {}: {}", rooms[e.0], rooms[e.1], why[e].join("; "));
    }
    println!("{} circles between files:", file_circles.len());
    for c in &file_circles {
        let names: Vec<&str> = c.iter().map(|&f| g.files[f].path.as_str()).collect();
        println!("  {}", names.join(", "));
    }

    assert!(
        g.edges.len() > 50 && rooms.len() > 20,
        "the import reader found too little to judge: {} files with imports, {} modules",
        g.edges.len(),
        rooms.len()
    );
    assert!(
        file_circles.is_empty(),
        "{} circles between files (run with --nocapture for the map)",
        file_circles.len()
    );
    assert!(
        upward.len() <= MAX_UPWARD,
        "{} imports run from a lower level up to a higher one (at most {MAX_UPWARD})",
        upward.len()
    );
}

#[test]
fn the_reader_sees_use_trees_inline_paths_and_test_modules() {
    let f = describe("src/a/b.rs");
    let text = r#"
        use crate::x::{y::Z, w as W, self};
        use super::c::D;
        // use crate::commented::Out;
        fn f() { let s = "crate::in_string::X"; crate::inline::path(); }
        mod tests { use super::*; use super::super::e::F; }
    "#;
    let got: Vec<Vec<String>> = referenced_paths(&f, text)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let want: Vec<Vec<String>> = [
        vec!["x", "y", "Z"],
        vec!["x", "w"],
        vec!["x", "self"],
        vec!["a", "c", "D"],
        vec!["inline", "path"],
        vec!["a", "b"],
        vec!["a", "e", "F"],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want);
}
