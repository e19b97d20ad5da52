//! The shape of the source, enforced: files with one job, functions read at once, no import
//! circles between a crate's files.
//!
//! - No product source file (`crates/*/src`, `python/src`) over [`MAX_FILE_LINES`] lines.
//! - No product function over [`MAX_FN_LINES`] lines. Test code (`#[cfg(test)]` modules, in a
//!   file or inline) is exempt: a model checker's step function reads best as one match.
//! - No `Result<_, String>` in a library's product code: each layer has its error type (the
//!   `dquant` binary, an edge, may use plain messages).
//! - No circle of imports between the files of one crate (`crate::a` in `b.rs` and `crate::b`
//!   in `a.rs`, or longer; every path form counts, see [`import_graph`]), except those in
//!   [`ALLOWED_CIRCLES`], each explained in its module doc. Test modules do not count. One
//!   circle is a module's own business ([`reported_circles`]): a child using the module it is
//!   part of (`super::X`) while that module uses the child, all inside one module's files.
//! - One tokio runtime per process: no product code but `dquant-runtime` builds one.
//! - One integration-test binary per crate (`tests/it/main.rs` when it has several
//!   concerns), except those in [`SEPARATE_TEST_BINARIES`], each with its reason.
//!
//! The parsing is lexical (comments, strings and char literals blanked, then braces counted),
//! which is exact for rustfmt-formatted code; the test of the checker below holds it to that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 80;

/// Circles that stay, by crate source directory and their files' module paths (sorted).
const ALLOWED_CIRCLES: &[(&str, &[&str])] = &[
    // An error names the width a token did not fit; parsing a width fails with that error
    // (crates/dquant-codec/src/error.rs says why it stays).
    ("crates/dquant-codec/src", &["error", "width"]),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The source directories: each crate's `src`, the Python extension's, and (for circles only)
/// the bench harness's and the test kit's. `(dir, is product code)`.
fn source_dirs() -> Vec<(PathBuf, bool)> {
    let root = repo_root();
    let mut dirs = Vec::new();
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .filter_map(Result::ok)
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    crates.sort();
    dirs.extend(crates.into_iter().map(|d| (d, true)));
    dirs.push((root.join("python/src"), true));
    dirs.push((root.join("bench/harness/src"), false));
    dirs.push((root.join("testkit/src"), false));
    dirs
}

/// `text` with comments, strings and char literals replaced by spaces (newlines kept), so
/// braces and paths can be counted.
fn blank_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let at = |c: &[char], i: usize, k: usize| c.get(i + k).copied();
    while i < c.len() {
        if c[i] == '/' && at(&c, i, 1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && at(&c, i, 1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(&c, i, 1) == Some('*') {
                    depth += 1;
                } else if c[i] == '*' && at(&c, i, 1) == Some('/') {
                    depth -= 1;
                    if depth == 0 {
                        out.push_str("  ");
                        i += 2;
                        break;
                    }
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == 'r' && matches!(at(&c, i, 1), Some('"' | '#')) && !ident_before(&c, i) {
            let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
            if at(&c, i, 1 + hashes) != Some('"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            out.push('"');
            i += 2 + hashes;
            while i < c.len() && !c[i..].starts_with(&close) {
                blank(&mut out, c[i]);
                i += 1;
            }
            out.push('"');
            i += close.len();
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && (at(&c, i, 2) == Some('\'') || at(&c, i, 1) == Some('\\')) {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote.
            out.push('\'');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident_before(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// `text` blanked ([`blank_literals`]) and, line by line, whether it is test code
/// ([`test_lines`]): what every check here reads a file as.
fn lex(text: &str) -> (String, Vec<bool>) {
    let blanked = blank_literals(text);
    let test = test_lines(&blanked.lines().collect::<Vec<_>>());
    (blanked, test)
}

/// The lines of `clean` (blanked text) that are test code: from a `#[cfg(test)]` item to its
/// end, and the whole file when it is a test module's file.
fn test_lines(clean: &[&str]) -> Vec<bool> {
    let mut test = vec![false; clean.len()];
    let mut i = 0;
    while i < clean.len() {
        if clean[i].trim() == "#[cfg(test)]" {
            let end = item_end(clean, i + 1).unwrap_or(i + 1);
            for t in &mut test[i..=end.min(clean.len() - 1)] {
                *t = true;
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    test
}

/// The last line of the item that starts at line `start`: where its braces close, or its `;`.
fn item_end(clean: &[&str], start: usize) -> Option<usize> {
    let mut depth = 0i64;
    let mut opened = false;
    for (j, line) in clean.iter().enumerate().skip(start) {
        for ch in line.chars() {
            match ch {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened && depth == 0 => return Some(j),
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return Some(j);
        }
    }
    None
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    // Rust writes the qualifiers in this order, so one pass strips any of them.
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"C\" ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&name[..end])
}

/// Functions of a file's product code longer than `max` lines: `(name, first line, lines)`.
fn long_fns(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let (blanked, test) = lex(text);
    let clean: Vec<&str> = blanked.lines().collect();
    let mut long = Vec::new();
    for (i, line) in clean.iter().enumerate() {
        let Some(name) = fn_name(line).filter(|_| !test[i]) else {
            continue;
        };
        if let Some(end) = item_end(&clean, i) {
            let n = end - i + 1;
            if n > max {
                long.push((name.to_string(), i + 1, n));
            }
        }
    }
    long
}

/// Files that are test modules of their parent (`#[cfg(test)] mod x;`).
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            let Some(m) = w[1]
                .trim()
                .strip_prefix("mod ")
                .and_then(|m| m.strip_suffix(';'))
            else {
                continue;
            };
            if w[0].trim() == "#[cfg(test)]" {
                let dir = module_dir(f);
                out.insert(dir.join(format!("{m}.rs")));
                out.insert(dir.join(m).join("mod.rs"));
            }
        }
    }
    out
}

/// Where the child modules of the file `f` live.
fn module_dir(f: &Path) -> PathBuf {
    let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let parent = f.parent().unwrap_or(Path::new(""));
    if matches!(stem, "lib" | "main" | "mod") {
        parent.to_path_buf()
    } else {
        parent.join(stem)
    }
}

/// A file's module path under its crate's `src`: `a/b.rs` and `a/b/mod.rs` are `["a", "b"]`.
fn module_path(src: &Path, f: &Path) -> Vec<String> {
    let rel = f.strip_prefix(src).unwrap_or(f).with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

/// A crate's import graph: each file's module path to the files it imports from.
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// The files of one crate, read as [`import_graph`] reads them: module path and product code
/// (blanked, test code dropped).
fn crate_modules(src: &Path, files: &[PathBuf]) -> Vec<(Vec<String>, String)> {
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            (module_path(src, f), product_code(&text))
        })
        .collect()
}

/// `text` blanked, with its test code's lines left empty.
fn product_code(text: &str) -> String {
    let (blanked, test) = lex(text);
    blanked
        .lines()
        .zip(&test)
        .map(|(l, t)| {
            if *t {
                "\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// The files of one crate that each file imports from, by module path: every path that starts
/// at `crate`, `self`, `super` (any number of times) or one of the file's own `mod` children,
/// whether in a `use` (`pub use` re-exports too, `{..}` groups expanded however nested) or
/// inline in code (`crate::x::f()`, `super::x::Y`), resolved to the longest module path that
/// is a file of the crate.
///
/// Decisions: a parent's `mod child;` is not an edge by itself (every child would otherwise
/// be in a circle with a parent it uses); a parent naming `child::X`, a re-export included, is.
/// A path is read as written: `super::X` is an edge to the parent's file even when the parent
/// only re-exports `X` from a sibling (import it from the sibling instead). The crate root
/// (`lib.rs`, `main.rs`) is no one's import: it is the crate's face, which declares and
/// re-exports every module, and its own items are the crate's shared context. Paths through a
/// `use`d alias (`use crate::a; a::X`) need no resolving: the `use` is already the edge.
fn import_graph(modules: &[(Vec<String>, String)]) -> Graph {
    let known: BTreeSet<&Vec<String>> = modules.iter().map(|(m, _)| m).collect();
    // Never the empty path: the crate root is no one's import.
    let longest = |path: &[String]| -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|m| known.contains(m))
    };
    let mut graph = Graph::new();
    for (me, code) in modules {
        let children = mod_children(code);
        let mut to: BTreeSet<Vec<String>> = named_paths(code)
            .iter()
            .filter_map(|p| absolute(p, me, &children))
            .filter_map(|p| longest(&p))
            .collect();
        to.remove(me);
        graph.insert(me.clone(), to);
    }
    graph
}

/// The modules `code` declares (`mod x;`, or inline `mod x { .. }`, which `absolute` then
/// resolves into the file itself).
fn mod_children(code: &str) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("mod ") {
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let mut p = PathReader { s: b, i: at + 4 };
        p.skip_ws();
        if let Some(name) = p.ident() {
            p.skip_ws();
            if matches!(p.peek(), Some(b';' | b'{')) {
                out.insert(name);
            }
        }
    }
    out
}

/// `path` made absolute (from the crate root) as module `me` with `children` reads it, or
/// `None` when it names something outside the crate (another crate, `std`, a local item).
fn absolute(path: &[String], me: &[String], children: &BTreeSet<String>) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some([me, rest].concat()),
        "super" => {
            let mut base = me.to_vec();
            base.pop()?;
            let supers = rest.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop()?;
            }
            Some([&base[..], &rest[supers..]].concat())
        }
        c if children.contains(c) => Some([me, path].concat()),
        _ => None,
    }
}

/// Every `::` path in `code` from where it starts (a `use` tree's `{..}` groups expanded into
/// one path per leaf, `self` in a group meaning the group's prefix), as written.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut p = PathReader {
        s: code.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    while p.i < p.s.len() {
        let starts = is_ident(p.s[p.i])
            && (p.i == 0 || !(is_ident(p.s[p.i - 1]) || matches!(p.s[p.i - 1], b':' | b'\'')));
        if !starts {
            p.i += 1;
            continue;
        }
        let at = p.i;
        let first = p.ident().unwrap_or_default();
        if first == "use" {
            p.skip_ws();
            if p.peek() == Some(b'{') {
                p.tree(&[], &mut out);
            }
        } else if p.s[p.i..].starts_with(b"::") {
            p.i = at;
            p.tree(&[], &mut out);
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A cursor over blanked code that reads paths and `use` trees.
struct PathReader<'a> {
    s: &'a [u8],
    i: usize,
}

impl PathReader<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.i;
        while self.peek().is_some_and(is_ident) {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    /// One tree after `prefix`: `a::b::c`, `a::{tree, ..}`, `a::*`, `a as b`; each leaf's
    /// whole path pushed to `out`.
    fn tree(&mut self, prefix: &[String], out: &mut Vec<Vec<String>>) {
        self.skip_ws();
        match self.peek() {
            Some(b'{') => return self.group(prefix, out),
            Some(b'*') => {
                self.i += 1;
                return out.push(prefix.to_vec());
            }
            _ => {}
        }
        let Some(id) = self.ident() else {
            return out.push(prefix.to_vec());
        };
        let mut path = prefix.to_vec();
        if id != "self" || prefix.is_empty() {
            path.push(id);
        }
        if self.s[self.i..].starts_with(b"::") {
            self.i += 2;
            self.tree(&path, out);
        } else {
            out.push(path);
        }
    }

    /// `{tree, tree as x, ..}` after `prefix`, the cursor on its `{`.
    fn group(&mut self, prefix: &[String], out: &mut Vec<Vec<String>>) {
        self.i += 1;
        loop {
            self.skip_ws();
            if matches!(self.peek(), None | Some(b'}')) {
                self.i += 1;
                return;
            }
            let before = self.i;
            self.tree(prefix, out);
            self.skip_ws();
            if self.s[self.i..].starts_with(b"as ") {
                self.i += 3;
                self.skip_ws();
                self.ident();
                self.skip_ws();
            }
            match self.peek() {
                Some(b',') => self.i += 1,
                _ if self.i == before => self.i += 1,
                _ => {}
            }
        }
    }
}

/// The circles of `graph` that break the rule. A circle that leaves one module's files (a
/// file and its descendants) counts whole. Inside one module's files, a child's use of its
/// ancestors (`super::X`: the module it is part of, whose private items Rust lets it see) is
/// its context, not an import: the parent keeps the types its children share and re-exports
/// what they make. Without those edges, a circle left there (siblings using each other) counts.
fn reported_circles(graph: &Graph) -> Vec<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for c in circles(graph) {
        let in_one_module = c.iter().any(|top| c.iter().all(|m| m.starts_with(top)));
        if !in_one_module {
            out.push(c);
            continue;
        }
        let members: BTreeSet<&Vec<String>> = c.iter().collect();
        let inner: Graph = c
            .iter()
            .map(|m| {
                let to = graph[m]
                    .iter()
                    .filter(|t| members.contains(t) && !m.starts_with(t))
                    .cloned()
                    .collect();
                (m.clone(), to)
            })
            .collect();
        out.extend(circles(&inner));
    }
    out
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn circles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct Tarjan<'g, N> {
        graph: &'g BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on: BTreeSet<N>,
        out: Vec<Vec<N>>,
    }
    impl<N: Ord + Clone> Tarjan<'_, N> {
        fn visit(&mut self, v: &N) {
            let i = self.index.len();
            self.index.insert(v.clone(), i);
            self.low.insert(v.clone(), i);
            self.stack.push(v.clone());
            self.on.insert(v.clone());
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.graph.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(&w);
                    let done = &w == v;
                    comp.push(w);
                    if done {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn rel(p: &Path) -> String {
    let root = repo_root().canonicalize().unwrap_or_else(|_| repo_root());
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    p.strip_prefix(&root).unwrap_or(&p).display().to_string()
}

/// Every product source file (not a test module's) with its text, and its source directory.
fn product_files() -> Vec<(PathBuf, PathBuf, String)> {
    let mut out = Vec::new();
    for (dir, product) in source_dirs() {
        if !product {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let tests = test_files(&files);
        for f in files.into_iter().filter(|f| !tests.contains(f)) {
            let text = std::fs::read_to_string(&f).expect("a source file");
            out.push((dir.clone(), f, text));
        }
    }
    out
}

#[test]
fn product_files_and_functions_are_short() {
    let mut long_files = Vec::new();
    let mut long_functions = Vec::new();
    for (_, f, text) in product_files() {
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            long_files.push(format!("{}: {lines} lines", rel(&f)));
        }
        for (name, at, n) in long_fns(&text, MAX_FN_LINES) {
            long_functions.push(format!("{}:{at}: fn {name}: {n} lines", rel(&f)));
        }
    }
    assert!(
        long_files.is_empty() && long_functions.is_empty(),
        "split these by job (files at most {MAX_FILE_LINES} lines, functions at most \
         {MAX_FN_LINES}):\n  {}",
        [long_files, long_functions].concat().join("\n  ")
    );
}

/// The lines of a file's product code that return a bare `String` as an error.
fn string_errors(text: &str) -> Vec<usize> {
    let (blanked, test) = lex(text);
    let squeezed = |l: &str| l.split_whitespace().collect::<String>();
    blanked
        .lines()
        .enumerate()
        .filter(|(i, l)| !test[*i] && l.contains("Result<") && squeezed(l).contains(",String>"))
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn libraries_have_typed_errors() {
    let mut found = Vec::new();
    for (dir, f, text) in product_files() {
        if dir.ends_with("crates/dquant-cli/src") {
            continue;
        }
        found.extend(
            string_errors(&text)
                .into_iter()
                .map(|l| format!("{}:{l}", rel(&f))),
        );
    }
    assert!(
        found.is_empty(),
        "a bare String as an error (give the layer's error enum a variant):\n  {}",
        found.join("\n  ")
    );
}

/// One tokio runtime per process: product code builds none but `dquant-runtime`'s, which
/// the control plane, object-store reads and upstream calls share (tests may build their
/// own).
#[test]
fn only_dquant_runtime_builds_a_runtime() {
    let mut found = Vec::new();
    for (dir, f, text) in product_files() {
        if dir.ends_with("crates/dquant-runtime/src") {
            continue;
        }
        let (blanked, test) = lex(&text);
        for (i, l) in blanked.lines().enumerate() {
            let builds = ["runtime::Builder", "Runtime::new(", "#[tokio::main"]
                .iter()
                .any(|p| l.contains(p));
            if builds && !test[i] {
                found.push(format!("{}:{}", rel(&f), i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a tokio runtime built outside dquant-runtime (use dquant_runtime::handle() or run()):\n  {}",
        found.join("\n  ")
    );
}

/// Integration-test binaries that stand apart from their crate's `tests/it`, and why.
const SEPARATE_TEST_BINARIES: &[(&str, &str)] = &[
    (
        "crates/dquant-storage/tests/eod_index.rs",
        "sets DQUANT_CACHE_DIR, which is the whole process's",
    ),
    (
        "crates/dquant-storage/tests/eod_cache_bound.rs",
        "sets DQUANT_CACHE_DIR and DQUANT_CACHE_MAX_BYTES, the whole process's, and prunes the \
         cache directory, which eod_index.rs's tests share",
    ),
    (
        "crates/dquant-plan/tests/startup.rs",
        "counts the whole process's allocations with a global allocator",
    ),
];

/// Each integration-test binary of the workspace's crates: `tests/NAME.rs` or
/// `tests/NAME/main.rs`.
fn test_binaries() -> Vec<String> {
    let root = repo_root();
    let mut members: Vec<PathBuf> = ["crates", "bench"]
        .iter()
        .filter_map(|d| std::fs::read_dir(root.join(d)).ok())
        .flat_map(|rd| rd.filter_map(Result::ok).map(|e| e.path()))
        .collect();
    members.push(root.join("testkit"));
    let mut out = Vec::new();
    for tests in members.iter().map(|m| m.join("tests")) {
        let Ok(entries) = std::fs::read_dir(&tests) else {
            continue;
        };
        for p in entries.filter_map(Result::ok).map(|e| e.path()) {
            if p.extension().is_some_and(|e| e == "rs") {
                out.push(rel(&p));
            } else if p.join("main.rs").is_file() {
                out.push(rel(&p.join("main.rs")));
            }
        }
    }
    out.sort();
    out
}

/// Every integration-test binary links the whole dependency stack (55 MB each for the
/// client's, before stripping): a crate keeps its tests in one binary (`tests/it/main.rs`
/// with a module per concern, or a lone `tests/NAME.rs`), so a clean test build links a
/// dozen binaries, not seventy.
#[test]
fn one_integration_test_binary_per_crate() {
    let binaries = test_binaries();
    let separate = |b: &String| SEPARATE_TEST_BINARIES.iter().any(|(p, _)| p == b);
    let mut per_crate: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for b in binaries.iter().filter(|b| !separate(b)) {
        let krate = b.split("/tests/").next().unwrap_or(b);
        per_crate.entry(krate).or_default().push(b);
    }
    per_crate.retain(|_, bs| bs.len() > 1);
    assert!(
        per_crate.is_empty(),
        "crates with several test binaries (make each a module of tests/it/main.rs, or say \
         in SEPARATE_TEST_BINARIES why one needs a process of its own):\n  {per_crate:?}"
    );
    let gone: Vec<_> = SEPARATE_TEST_BINARIES
        .iter()
        .filter(|(p, _)| !binaries.iter().any(|b| b == p))
        .collect();
    assert!(
        gone.is_empty(),
        "SEPARATE_TEST_BINARIES names binaries that are gone: {gone:?}"
    );
}

/// A reported circle: its files' module paths (`a::b`), and the edges between them (`a -> b`).
type NamedCircle = (Vec<String>, Vec<String>);

/// Each reported circle of `graph`, named for the message that asks to break it.
fn named_circles(graph: &Graph) -> Vec<NamedCircle> {
    let name = |m: &Vec<String>| m.join("::");
    reported_circles(graph)
        .into_iter()
        .map(|c| {
            let edges = c
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|t| c.contains(t))
                        .map(move |t| format!("{} -> {}", name(m), name(t)))
                })
                .collect();
            (c.iter().map(name).collect(), edges)
        })
        .collect()
}

#[test]
fn no_import_circles_between_a_crates_files() {
    let mut found: HashMap<String, Vec<NamedCircle>> = HashMap::new();
    for (dir, _) in source_dirs() {
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let tests = test_files(&files);
        files.retain(|f| !tests.contains(f));
        let graph = import_graph(&crate_modules(&dir, &files));
        found.insert(rel(&dir), named_circles(&graph));
    }
    let is = |m: &[&str], c: &[String]| m.iter().copied().eq(c.iter().map(String::as_str));
    let mut unexpected = Vec::new();
    for (dir, cs) in &found {
        for (c, edges) in cs {
            if !ALLOWED_CIRCLES.iter().any(|(d, m)| d == dir && is(m, c)) {
                unexpected.push(format!("{dir}: {} ({})", c.join(" <-> "), edges.join(", ")));
            }
        }
    }
    let gone: Vec<_> = ALLOWED_CIRCLES
        .iter()
        .filter(|(d, m)| {
            !found
                .get(*d)
                .is_some_and(|cs| cs.iter().any(|(c, _)| is(m, c)))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "files that import each other (move what both need into a module of its own):\n  {}",
        unexpected.join("\n  ")
    );
    assert!(
        gone.is_empty(),
        "allowed circles that are gone (remove them from ALLOWED_CIRCLES): {gone:?}"
    );
    assert!(
        ALLOWED_CIRCLES.len() <= 3,
        "at most 3 import circles may stay"
    );
}

/// The checker finds what it must, and is not fooled by braces in strings, comments or
/// char literals, nor by test code.
#[test]
fn the_checker_measures_functions_and_finds_circles() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "/// doc {{\npub(crate) fn long<'a>(s: &'a str) -> char {{\n    let _ = \"}}\";\n    let _ = r#\"}}\"#;\n    // }}\n{}    '}}'\n}}\n\nfn short() {{}}\n\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(80),
        body(100)
    );
    assert_eq!(long_fns(&text, 80), vec![("long".to_string(), 2, 86)]);
    assert_eq!(long_fns(&text, 86), vec![]);
    assert_eq!(
        string_errors("fn a() -> Result<u8, String> {}\n// Result<u8, String>\nfn b() -> Result<(), E> {}\n#[cfg(test)]\nmod tests {\n    fn c() -> Result<(), String> {}\n}\n"),
        vec![1]
    );

    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        circles(&graph(&[
            ("a", "b"),
            ("b", "c"),
            ("c", "a"),
            ("c", "d"),
            ("d", "e"),
            ("e", "d")
        ])),
        vec![
            vec!["d".to_string(), "e".to_string()],
            vec!["a".to_string(), "b".to_string(), "c".to_string()]
        ]
    );
    assert_eq!(
        circles(&graph(&[("a", "b"), ("b", "c")])),
        Vec::<Vec<String>>::new()
    );
    the_checker_resolves_every_import_form();
}

/// The edges [`import_graph`] finds from module `me` (its text `code`) in a crate whose other
/// files are `others`, by module path (`a::b`).
fn edges_from(me: &str, code: &str, others: &[&str]) -> Vec<String> {
    let path = |m: &str| -> Vec<String> { m.split("::").map(str::to_string).collect() };
    let mut modules: Vec<_> = others.iter().map(|m| (path(m), String::new())).collect();
    modules.push((path(me), product_code(code)));
    let graph = import_graph(&modules);
    graph[&path(me)].iter().map(|m| m.join("::")).collect()
}

fn the_checker_resolves_every_import_form() {
    let crate_ = ["a", "a::kid", "a::b", "a::b::c", "d", "q", "q::r"];
    let cases: &[(&str, &str, &[&str])] = &[
        // `self::`, and a `mod` child used through `self` or by its name.
        ("a", "mod kid;\nuse self::kid::K;\n", &["a::kid"]),
        ("a", "mod kid;\nuse kid::K;\n", &["a::kid"]),
        // Declaring a child is not an import; nor is a name that is no child of this file.
        ("a", "pub mod kid;\nuse b::B;\nfn f() { q::r(); }\n", &[]),
        // `super::`, twice, from a nested file; `super` alone (a glob).
        ("a::b::c", "use super::super::kid::K;\n", &["a::kid"]),
        ("a::b::c", "use super::*;\n", &["a::b"]),
        ("a::b", "use super::super::d::D;\n", &["d"]),
        // Nested groups, `self` in a group, `as` renames, several lines.
        (
            "d",
            "use crate::{\n    a::{self, b::{c::C as X, B}},\n    q::r::R,\n};\n",
            &["a", "a::b", "a::b::c", "q::r"],
        ),
        // A group right after `use`.
        ("a::b", "use {crate::q, super::kid};\n", &["a::kid", "q"]),
        // Paths inline in code, with no `use`: calls, types, turbofish, `$crate` in a macro.
        (
            "d",
            "fn f(x: crate::q::r::R) { super::a::kid::g::<u8>(); }\nmacro_rules! m { () => { $crate::a::b::h() }; }\n",
            &["a::b", "a::kid", "q::r"],
        ),
        // Re-exports, `pub(crate)` and a child's group with `self`.
        ("a", "mod kid;\npub(crate) use kid::{self as k, K};\n", &["a::kid"]),
        ("d", "pub use crate::q::r::R;\n", &["q::r"]),
        // Not imports: comments, strings, test code, other crates' paths that end alike,
        // `pub(crate)`, and the crate root.
        (
            "d",
            "// crate::a\nconst S: &str = \"crate::q\";\nuse dquant_x::q::r;\npub(crate) fn f() { other::a::kid(); crate::main(); }\n#[cfg(test)]\nmod tests {\n    use crate::a::b;\n}\n",
            &[],
        ),
    ];
    for (me, code, want) in cases {
        let others: Vec<&str> = crate_.iter().copied().filter(|m| m != me).collect();
        assert_eq!(edges_from(me, code, &others), *want, "{me}: {code}");
    }

    // The agent's circle as it stood: the parent's re-export of its child is its edge.
    let agent = [
        (
            "serve_plan",
            "use crate::sessions::Work;\nuse crate::share::{relay, FrameOutlet};\npub(crate) fn ended() {}\n",
        ),
        ("sessions", "pub enum Work { Subscriber { sub: crate::share::Subscription } }\n"),
        ("share", "mod broadcast;\nmod produce;\npub(crate) use broadcast::serve_subscriber;\n"),
        ("share::broadcast", "use super::{End, SharedStream};\nuse crate::serve_plan::ended;\n"),
        ("share::produce", "use super::broadcast::{close, Writer};\n"),
        ("metrics", "pub struct Meter;\n"),
    ];
    let modules: Vec<_> = agent
        .iter()
        .map(|(m, c)| (m.split("::").map(str::to_string).collect(), product_code(c)))
        .collect();
    let found: Vec<Vec<String>> = reported_circles(&import_graph(&modules))
        .into_iter()
        .map(|c| c.into_iter().map(|m| m.join("::")).collect())
        .collect();
    assert_eq!(
        found,
        vec![vec!["serve_plan", "sessions", "share", "share::broadcast"]]
    );

    // Inside one module's files a child may use its ancestors; siblings may not use each
    // other, and a circle that leaves the module counts whole.
    let reported = |edges: &[(&str, &str)]| -> Vec<Vec<String>> {
        let path = |m: &str| -> Vec<String> { m.split("::").map(str::to_string).collect() };
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(path(a)).or_default().insert(path(b));
            g.entry(path(b)).or_default();
        }
        let names = reported_circles(&g).into_iter();
        names
            .map(|c| c.iter().map(|m| m.join("::")).collect())
            .collect()
    };
    let family = [
        ("r", "r::a"),
        ("r::a", "r"),
        ("r::a::x", "r"),
        ("r", "r::a::x"),
    ];
    assert_eq!(reported(&family), Vec::<Vec<String>>::new());
    assert_eq!(
        reported(&[family.as_slice(), &[("r::a", "r::b"), ("r::b", "r::a")]].concat()),
        vec![vec!["r::a", "r::b"]]
    );
    assert_eq!(
        reported(&[("r::a", "r"), ("r", "o"), ("o", "r::a")]),
        vec![vec!["o", "r", "r::a"]]
    );
}
