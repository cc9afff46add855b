//! The library's layers hold one way, and no source file outgrows the limit.
//!
//! Reads every `dlock/src/**/*.rs` with `syn`, collects each reference into
//! the crate (`use` trees, `crate::`/`super::`/`self::` paths, and the same
//! inside macro calls), resolves it to the module it names, and checks it
//! against [`FLOORS`], the one table of who may import whom (drawn in
//! `ARCHITECTURE.md`). Test-only code (`#[cfg(test)]` items and modules) is
//! left out: a unit test may use any backend. Then it asserts that the
//! top-level modules (with each backend as a node of its own) form no cycle,
//! and that no `.rs` file of the workspace is over [`MAX_LINES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// Who may import whom: each unit (a module path; a file belongs to the
/// longest unit its module path starts with) and the units it may use. A
/// unit always uses itself. Bottom floor first; the lists never point up.
#[rustfmt::skip]
const FLOORS: &[(&str, &[&str])] = &[
    // Floor 0: shared utilities that know nothing of locks.
    ("url",               &[]),
    // Fenced writes: the storage side of a fencing token, knowing nothing else.
    ("fence",             &[]),
    // Floor 1: the contract between the core and the services, and its vocabulary.
    ("backend",           &["url"]),
    // Floor 2: what both the core and the backends stand on: dlock's own
    // runtime, the ttl bounds, the store of named backends.
    ("lease::background", &["backend", "url"]),
    ("lease::ttl",        &["backend"]),
    ("registry",          &["backend"]),
    // Floor 3a: the services, each knowing only the contract, floor 2 and
    // the backends' shared helpers (`backends`: mod.rs, announcements, ...);
    // no backend knows another but Redlock, made of Redis backends.
    ("backends",            &["backend"]),
    ("backends::memory",    A_BACKEND),
    ("backends::redis",     A_BACKEND),
    ("backends::etcd",      A_BACKEND),
    ("backends::zookeeper", A_BACKEND),
    ("backends::mysql",     A_BACKEND),
    ("backends::postgres",  A_BACKEND),
    ("backends::redlock",   &["backend", "url", "lease::background", "lease::ttl", "backends", "backends::redis"]),
    // Floor 3b: the lease machinery every lock kind shares, knowing no backend.
    ("lease",     &["backend", "url", "lease::background", "lease::ttl", "registry"]),
    // Floor 4: the lock kinds a user holds.
    ("locks",     &["backend", "url", "lease::background", "lease::ttl", "registry", "lease"]),
    // Floor 5: operator features, URL → backend, what the macro expands to.
    ("inspect",   &["backend", "url", "lease::background", "lease::ttl", "lease", "locks"]),
    ("connect",   &["backend", "url", "lease::background", "registry", "backends", EVERY_BACKEND]),
    ("__private", &["backend", "lease::background", "lease::ttl", "lease", "locks"]),
    ("axum",      &["backend"]),
    // Floor 6: operator entry points, above every other floor.
    ("shutdown",  &["backend", "url", "lease::background", "registry", "lease", "locks", "inspect", "connect"]),
    ("blocking",  &["backend", "url", "lease::background", "registry", "locks", "connect"]),
    // The user's manual: rustdoc pages, no code.
    ("guide",     &[]),
];

/// What a backend may use.
const A_BACKEND: &[&str] = &[
    "backend",
    "url",
    "lease::background",
    "lease::ttl",
    "backends",
];

/// In a "may use" list: every backend.
const EVERY_BACKEND: &str = "backends::*";

/// The hard limit on a source file's lines (the aim is 700).
const MAX_LINES: usize = 800;

/// Files over [`MAX_LINES`] that someone is splitting right now; the list only
/// shrinks, and an entry no longer over the limit fails the test until it is
/// removed.
const SPLIT_PENDING: &[&str] = &[];

/// One reference from a file into the crate.
struct Reference {
    file: String,
    /// As written (`crate::inspect::holder_of`).
    written: String,
    /// The module path it names, resolved (`["inspect", "holder_of"]`).
    target: Vec<String>,
}

/// What one file contributes.
struct Parsed {
    module: Vec<String>,
    references: Vec<Reference>,
    /// Modules declared here under `#[cfg(test)]`: test-only files.
    test_modules: Vec<Vec<String>>,
    /// `pub use` at the crate root: name → the path it re-exports.
    root_aliases: BTreeMap<String, Vec<String>>,
}

/// The workspace checked: this one, or the one `LAYERS_CHECK_ROOT` names
/// (to measure another checkout, e.g. an older commit, with this test).
fn workspace_root() -> PathBuf {
    match std::env::var_os("LAYERS_CHECK_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace holds dlock/")
            .to_owned(),
    }
}

fn source_dir() -> PathBuf {
    workspace_root().join("dlock").join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// `src/lib.rs` → `[]`, `src/a/mod.rs` and `src/a.rs` → `[a]`, `src/a/b.rs` → `[a, b]`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (stem == "lib" && parts.is_empty())) {
        parts.push(stem.to_owned());
    }
    // `#[path = "private.rs"] pub mod __private;`
    if parts == ["private"] {
        parts = vec!["__private".into()];
    }
    parts
}

/// `#[cfg(test)]` or `#[cfg(all(test, ..))]`: code only unit tests compile.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let inner = a
                .meta
                .require_list()
                .map(|l| l.tokens.to_string())
                .unwrap_or_default();
            inner == "test" || inner.starts_with("all (test")
        }
    })
}

struct Collector<'a> {
    file: &'a str,
    /// The module the code being visited is in (the file's, plus inline `mod`s).
    module: Vec<String>,
    /// Modules that exist (files), to resolve `child::item` paths.
    known: &'a BTreeSet<Vec<String>>,
    out: Parsed,
}

impl Collector<'_> {
    /// Resolves a path written in the current module; `None` if it is not
    /// into the crate (std, a dependency, a local name).
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.module.clone(),
            "super" => self.module.clone(),
            _ => {
                let mut child = self.module.clone();
                child.push(first.clone());
                if segments.len() >= 2 && self.known.contains(&child) {
                    let mut target = self.module.clone();
                    target.extend(segments.iter().cloned());
                    return Some(target);
                }
                return None;
            }
        };
        let mut rest = &segments[1..];
        if first == "super" {
            base.pop();
        }
        while rest.first().map(String::as_str) == Some("super") {
            base.pop();
            rest = &rest[1..];
        }
        if rest.is_empty() {
            return None;
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn record(&mut self, segments: Vec<String>) {
        if let Some(target) = self.resolve(&segments) {
            self.out.references.push(Reference {
                file: self.file.to_owned(),
                written: segments.join("::"),
                target,
            });
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, public_root: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, public_root);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                let mut full = prefix.clone();
                if name != "self" {
                    full.push(name.clone());
                }
                self.alias(public_root, full.last().cloned(), &full);
                self.record(full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.alias(public_root, Some(r.rename.to_string()), &full);
                self.record(full);
            }
            syn::UseTree::Glob(_) => self.record(prefix.clone()),
            syn::UseTree::Group(g) => {
                for item in &g.items {
                    self.use_tree(prefix, item, public_root);
                }
            }
        }
    }

    fn alias(&mut self, public_root: bool, name: Option<String>, full: &[String]) {
        if let (true, Some(name)) = (public_root, name) {
            if let Some(target) = self.resolve(full) {
                self.out.root_aliases.insert(name, target);
            }
        }
    }

    /// `crate :: a :: b` (or `super`, `self`, `$crate`) inside a macro's tokens.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(g) = &trees[i] {
                self.scan_tokens(g.stream());
            }
            let starts = matches!(&trees[i], TokenTree::Ident(id)
                if *id == "crate" || *id == "super" || (*id == "self" && path_sep_at(&trees, i + 1)));
            let after_path = i >= 2 && path_sep_at(&trees, i - 2);
            if starts && !after_path {
                let mut segments = vec![trees[i].to_string()];
                let mut j = i + 1;
                while path_sep_at(&trees, j) {
                    match trees.get(j + 2) {
                        Some(TokenTree::Ident(id)) => segments.push(id.to_string()),
                        _ => break,
                    }
                    j += 3;
                }
                i = j;
                if segments.len() >= 2 {
                    self.record(segments);
                }
                continue;
            }
            i += 1;
        }
    }
}

fn path_sep_at(trees: &[TokenTree], i: usize) -> bool {
    matches!((trees.get(i), trees.get(i + 1)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
            if a.as_char() == ':' && b.as_char() == ':')
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // Doc links and `#[path]` are not imports.
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_cfg_test(attrs) {
            if let syn::Item::Mod(m) = item {
                let mut module = self.module.clone();
                module.push(m.ident.to_string());
                self.out.test_modules.push(module);
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        if let syn::ImplItem::Fn(f) = item {
            if is_cfg_test(&f.attrs) {
                return;
            }
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let public_root = self.module.is_empty() && matches!(u.vis, syn::Visibility::Public(_));
        self.use_tree(&mut Vec::new(), &u.tree, public_root);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() >= 2 {
            self.record(segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.scan_tokens(mac.tokens.clone());
    }
}

fn parse_crate() -> (Vec<Parsed>, usize) {
    let src = source_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let relative: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(&src).expect("under src").to_owned())
        .collect();
    let known: BTreeSet<Vec<String>> = relative.iter().map(|r| module_of(r)).collect();
    let mut parsed = Vec::new();
    for (path, rel) in files.iter().zip(&relative) {
        let text = std::fs::read_to_string(path).expect("readable source");
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let shown = format!("dlock/src/{}", rel.display());
        let mut collector = Collector {
            file: &shown,
            module: module_of(rel),
            known: &known,
            out: Parsed {
                module: module_of(rel),
                references: Vec::new(),
                test_modules: Vec::new(),
                root_aliases: BTreeMap::new(),
            },
        };
        collector.visit_file(&ast);
        parsed.push(collector.out);
    }
    (parsed, files.len())
}

/// The unit a module path belongs to: the longest [`FLOORS`] entry it starts with.
fn unit_of(module: &[String]) -> Option<&'static str> {
    FLOORS
        .iter()
        .map(|(unit, _)| *unit)
        .filter(|unit| {
            let parts: Vec<&str> = unit.split("::").collect();
            module.len() >= parts.len() && parts.iter().zip(module).all(|(a, b)| a == b)
        })
        .max_by_key(|unit| unit.len())
}

/// The node of the cycle graph: the top-level module, or `backends::<name>`.
fn node_of(module: &[String]) -> String {
    match module {
        [top, name, ..] if top == "backends" => format!("backends::{name}"),
        [top, ..] => top.clone(),
        [] => "crate".into(),
    }
}

/// Every reference of non-test code with the module it points at, root
/// re-exports followed (`crate::LockError` → `backend::error::LockError`).
fn resolved_references() -> (Vec<(Vec<String>, Reference)>, usize) {
    let (parsed, files) = parse_crate();
    let aliases: BTreeMap<String, Vec<String>> =
        parsed.iter().flat_map(|p| p.root_aliases.clone()).collect();
    let test_only: Vec<Vec<String>> = parsed.iter().flat_map(|p| p.test_modules.clone()).collect();
    let mut out = Vec::new();
    for file in parsed {
        if test_only.iter().any(|t| file.module.starts_with(t)) {
            continue;
        }
        for mut reference in file.references {
            if let Some(real) = reference.target.first().and_then(|f| aliases.get(f)) {
                let mut target = real.clone();
                target.extend(reference.target[1..].iter().cloned());
                reference.target = target;
            }
            out.push((file.module.clone(), reference));
        }
    }
    (out, files)
}

#[test]
fn imports_go_down_the_floors() {
    let (references, files) = resolved_references();
    let mut broken = Vec::new();
    let mut crossing = 0;
    let mut seen = BTreeSet::new();
    for (module, reference) in &references {
        if module.is_empty() {
            continue; // the crate root re-exports every floor
        }
        let from = unit_of(module).unwrap_or_else(|| {
            panic!(
                "{} is on no floor: add its module to FLOORS",
                reference.file
            )
        });
        let Some(to) = unit_of(&reference.target) else {
            continue; // a root item defined in lib.rs itself, or a macro-generated name
        };
        if from == to {
            continue;
        }
        crossing += 1;
        seen.insert((from, to));
        let allowed = FLOORS
            .iter()
            .find(|(u, _)| *u == from)
            .map(|(_, a)| *a)
            .unwrap_or(&[]);
        let any_backend = allowed.contains(&EVERY_BACKEND) && to.starts_with("backends::");
        if !allowed.contains(&to) && !any_backend {
            broken.push(format!(
                "{} imports `{}`: `{from}` may use only [{}], not `{to}` (move what it needs to a lower floor, or this code up)",
                reference.file,
                reference.written,
                allowed.join(", ")
            ));
        }
    }
    println!(
        "{files} files, {} references into the crate, {crossing} between units",
        references.len()
    );
    assert!(
        files >= 100,
        "only {files} source files found under dlock/src: is the path right?"
    );
    assert!(
        references.len() >= 500,
        "only {} references found: the scanner is broken",
        references.len()
    );
    assert!(
        crossing >= 100,
        "only {crossing} references between units: the scanner is broken"
    );
    // Edges every version of the crate has: if one is missing, resolution broke.
    for edge in [
        ("locks", "lease"),
        ("lease", "backend"),
        ("backends::redis", "backend"),
        ("backends::redlock", "backends::redis"),
        ("connect", "backends::memory"),
    ] {
        assert!(
            seen.contains(&edge),
            "no reference from `{}` to `{}` found: the scanner is broken",
            edge.0,
            edge.1
        );
    }
    // Every backend is a unit of its own, so that no backend uses another.
    let backends = std::fs::read_to_string(source_dir().join("backends").join("mod.rs"))
        .expect("dlock/src/backends/mod.rs");
    for line in backends.lines() {
        if let Some(name) = line
            .trim()
            .strip_prefix("pub mod ")
            .and_then(|n| n.strip_suffix(';'))
        {
            let unit = format!("backends::{name}");
            if !FLOORS.iter().any(|(u, _)| *u == unit) {
                broken.push(format!(
                    "dlock/src/backends/mod.rs declares the backend `{name}`, which FLOORS does not list: add (\"{unit}\", A_BACKEND)"
                ));
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(
        broken.is_empty(),
        "{} imports go the wrong way:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Every elementary cycle of a small directed graph (each once, starting at
/// its least node), at most `limit`.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>, limit: usize) -> Vec<Vec<String>> {
    fn walk(
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        edges: &BTreeMap<String, BTreeSet<String>>,
        found: &mut Vec<Vec<String>>,
        limit: usize,
    ) {
        for next in edges.get(at).into_iter().flatten() {
            if found.len() >= limit {
                return;
            }
            if next == start {
                found.push(path.clone());
            } else if next.as_str() > start && !path.contains(next) {
                path.push(next.clone());
                walk(start, next, path, edges, found, limit);
                path.pop();
            }
        }
    }
    let mut found = Vec::new();
    for start in edges.keys() {
        walk(
            start,
            start,
            &mut vec![start.clone()],
            edges,
            &mut found,
            limit,
        );
    }
    found
}

#[test]
fn no_cycles_between_top_level_modules() {
    assert_no_cycles("top-level modules", |module| match module.first() {
        Some(top) => top.clone(),
        None => "crate".into(),
    });
}

#[test]
fn no_cycles_between_backends_and_the_rest() {
    assert_no_cycles("modules (each backend one)", node_of);
}

/// Builds the graph of `node`s that the crate's references draw, and fails
/// on any cycle in it, naming an import for each of its steps.
fn assert_no_cycles(what: &str, node: fn(&[String]) -> String) {
    let (references, _) = resolved_references();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut witness: BTreeMap<(String, String), String> = BTreeMap::new();
    for (module, reference) in &references {
        let (from, to) = (node(module), node(&reference.target));
        if module.is_empty() || from == to || to == "crate" {
            continue;
        }
        witness
            .entry((from.clone(), to.clone()))
            .or_insert_with(|| format!("{} imports `{}`", reference.file, reference.written));
        edges.entry(from).or_default().insert(to);
    }
    println!(
        "{what}: {} import others, {} edges",
        edges.len(),
        witness.len()
    );
    assert!(
        edges.len() >= 10,
        "only {} {what} import others: the scanner is broken",
        edges.len()
    );
    let found = cycles(&edges, 10_000);
    let shown: Vec<String> = found
        .iter()
        .take(20)
        .map(|c| {
            let steps: Vec<String> = c
                .iter()
                .zip(c.iter().cycle().skip(1))
                .map(|(a, b)| format!("  {a} -> {b}: {}", witness[&(a.clone(), b.clone())]))
                .collect();
            format!("{} -> {}\n{}", c.join(" -> "), c[0], steps.join("\n"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "{} cycles between {what} (first {}):\n{}",
        found.len(),
        shown.len(),
        shown.join("\n")
    );
}

#[test]
fn no_source_file_is_over_the_limit() {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut sizes: Vec<(usize, String)> = files
        .iter()
        .map(|f| {
            let lines = std::fs::read_to_string(f)
                .map(|t| t.lines().count())
                .unwrap_or(0);
            (
                lines,
                f.strip_prefix(&root)
                    .expect("under root")
                    .display()
                    .to_string(),
            )
        })
        .collect();
    sizes.sort_by(|a, b| b.cmp(a));
    assert!(
        sizes.len() >= 200,
        "only {} .rs files in the workspace: is the path right?",
        sizes.len()
    );
    println!("the biggest of {} .rs files:", sizes.len());
    for (lines, file) in sizes.iter().take(10) {
        println!("  {lines:5} {file}");
    }
    let over: Vec<String> = sizes
        .iter()
        .filter(|(lines, file)| *lines > MAX_LINES && !SPLIT_PENDING.contains(&file.as_str()))
        .map(|(lines, file)| format!("{file}: {lines} lines"))
        .collect();
    assert!(
        over.is_empty(),
        "over {MAX_LINES} lines (split along what each part does):\n{}",
        over.join("\n")
    );
    let done: Vec<&&str> = SPLIT_PENDING
        .iter()
        .filter(|p| {
            !sizes
                .iter()
                .any(|(lines, file)| file == **p && *lines > MAX_LINES)
        })
        .collect();
    assert!(
        done.is_empty(),
        "no longer over {MAX_LINES} lines (or gone): remove {done:?} from SPLIT_PENDING"
    );
}
