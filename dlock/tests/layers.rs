//! The library's layers hold one way, and no source file outgrows the limit.
//!
//! Reads every `dlock/src/**/*.rs` with `syn`, collects each reference into
//! the crate (`use` trees, `crate::`/`super::`/`self::` paths, and the same
//! inside macro calls) and each call of a method through `self.` or `Self::`
//! (resolved to the file whose inherent `impl` defines it: a method call
//! ties two floors as an import does), resolves it to the module it names,
//! and checks it against [`FLOORS`], the one table of who may import whom (drawn in
//! `ARCHITECTURE.md`). Test-only code (`#[cfg(test)]` items and modules) is
//! left out: a unit test may use any backend. Then it asserts that the
//! top-level modules (with each backend as a node of its own) form no cycle,
//! and that no `.rs` file of the workspace is over [`MAX_LINES`].

use std::collections::{BTreeMap, BTreeSet};

#[path = "layers/scan.rs"]
mod scan;

use std::path::Path;

use scan::{
    cycles, file_modules_in, resolved_references, resolved_references_in, rust_files, source_dir,
    workspace_root,
};

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
    // the backends' shared helpers (`backends`: mod.rs, announcements,
    // `?fence_retention=`, ..., which may use what every backend may use
    // below them); no backend knows another but Redlock, made of Redis backends.
    ("backends",            &["backend", "url", "lease::background", "lease::ttl"]),
    ("backends::memory",    A_BACKEND),
    ("backends::redis",     A_BACKEND),
    ("backends::etcd",      A_BACKEND),
    ("backends::zookeeper", A_BACKEND),
    ("backends::mysql",     A_BACKEND),
    ("backends::postgres",  A_BACKEND),
    ("backends::file",      A_BACKEND),
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

/// One backend's floors: each unit and the units it may use, bottom first.
type Floors = &'static [(&'static str, &'static [&'static str])];

/// Inside a backend, its own floors: each folder (or file) under
/// `backends/<name>/` and the ones below it that it may use, bottom first.
/// The backend's root file (`backends/<name>.rs`: the backend type, whose
/// state its children extend with `impl` blocks) and each folder's module
/// file are the parent ↔ child link, not floors. Drawn in ARCHITECTURE.md
/// ("Inside a backend"); Redis is the model for the others.
#[rustfmt::skip]
const BACKEND_FLOORS: &[(&str, Floors)] = &[
    ("redis", &[
        // The URL and its options; the scripts and key names.
        ("config",      &[]),
        ("protocol",    &[]),
        // Connections, then where the servers are.
        ("transport",   &["config", "protocol"]),
        ("topology",    &["config", "protocol", "transport"]),
        // One request on its way, then waiting in line, made of requests.
        ("calls",       &["config", "protocol", "transport", "topology"]),
        ("waiting",     &["config", "protocol", "transport", "topology", "calls"]),
        // The kinds of lock, then the layouts beside dlock's own.
        ("kinds",       &["config", "protocol", "transport", "topology", "waiting", "calls"]),
        ("layout",      &["config", "protocol", "transport", "topology", "waiting", "calls", "kinds"]),
        // What assembles the backend, and what Redlock uses of it.
        ("connect",     &["config", "protocol", "transport", "topology", "waiting", "calls", "kinds", "layout"]),
        ("for_redlock", &["config", "protocol", "transport", "topology", "waiting", "calls", "kinds"]),
    ]),
];

/// Files over [`MAX_LINES`] that someone is splitting right now; the list only
/// shrinks, and an entry no longer over the limit fails the test until it is
/// removed.
const SPLIT_PENDING: &[&str] = &[];

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

#[test]
fn imports_go_down_the_floors() {
    let (references, files) = resolved_references("dlock");
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
    let backends = std::fs::read_to_string(source_dir("dlock").join("backends").join("mod.rs"))
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

#[test]
fn no_cycles_between_top_level_modules() {
    let edges = unit_edges(|module| match module.first() {
        Some(top) => top.clone(),
        None => "crate".into(),
    });
    assert_no_cycles("top-level modules", edges, 10);
}

#[test]
fn no_cycles_between_backends_and_the_rest() {
    assert_no_cycles("modules (each backend one)", unit_edges(node_of), 10);
}

/// Inside a backend, files import one way too: a change to how a waiter is
/// woken should not ripple back into the connection it stands on.
#[test]
fn no_cycles_between_files_of_a_backend() {
    let edges = file_edges("dlock", backend_group);
    assert_no_cycles("files of one backend", edges, 30);
}

#[test]
fn no_cycles_between_files_of_the_macro_crate() {
    let edges = file_edges("dlock-macros", |_| Some(String::new()));
    assert_no_cycles("files of dlock-macros", edges, 5);
}

/// Inside a backend that declares its floors, every import (and method
/// call through `self`) between two of its units goes down.
#[test]
fn imports_inside_a_backend_go_down_its_floors() {
    let (broken, crossing) = backend_floor_breaks(&source_dir("dlock"));
    println!("{crossing} references between the floors of backends that declare them");
    assert!(
        crossing >= 50,
        "only {crossing} references between floors: the scanner is broken"
    );
    assert!(
        broken.is_empty(),
        "{} imports go up a backend's floors:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The checker itself, on a planted crate with a two-way tie between two
/// floors of the Redis backend that no import shows one way of: `waiting`
/// imports a type of `calls` (down), and `calls` calls a method that
/// `waiting` defines on the backend (up, `self.key_is_free()`). The floors
/// check names the call; without the call it is clean (so it is the call
/// that is seen, and an import check alone would have passed the tie).
#[test]
fn the_checker_sees_a_two_way_tie_made_by_a_method_call() {
    let planted = planted_crate(true);
    let (broken, _) = backend_floor_breaks(&planted);
    assert!(
        broken
            .iter()
            .any(|b| b.contains("calls/requests.rs") && b.contains("self.key_is_free()")),
        "the method call up a floor is not seen: {broken:?}"
    );
    let imports_only: Vec<&String> = broken.iter().filter(|b| !b.contains("self.")).collect();
    assert!(
        imports_only.is_empty(),
        "only the method call goes up: {imports_only:?}"
    );
    let clean = planted_crate(false);
    let (broken, crossing) = backend_floor_breaks(&clean);
    assert!(broken.is_empty(), "{broken:?}");
    assert_eq!(crossing, 1, "the import down is the one reference left");
    let _ = std::fs::remove_dir_all(planted.parent().expect("a crate dir"));
    let _ = std::fs::remove_dir_all(clean.parent().expect("a crate dir"));
}

/// A crate's `src` in a fresh temporary directory: a Redis backend with two
/// floors, `waiting` importing `calls`, and (`tie`) `calls` calling a
/// method `waiting` defines.
fn planted_crate(tie: bool) -> std::path::PathBuf {
    let root =
        std::env::temp_dir().join(format!("dlock-layers-planted-{}-{tie}", std::process::id()));
    let src = root.join("src");
    let call = if tie { "self.key_is_free();" } else { "" };
    let files = [
        ("lib.rs", "pub mod backends;\n".to_owned()),
        ("backends/mod.rs", "pub mod redis;\n".to_owned()),
        (
            "backends/redis.rs",
            "pub struct RedisBackend;\nmod calls;\nmod waiting;\n".to_owned(),
        ),
        ("backends/redis/calls.rs", "pub mod requests;\n".to_owned()),
        (
            "backends/redis/calls/requests.rs",
            format!(
                "use crate::backends::redis::RedisBackend;\npub struct Answer;\n\
                 impl RedisBackend {{\n    pub fn attempt(&self) -> Answer {{ {call} Answer }}\n}}\n"
            ),
        ),
        ("backends/redis/waiting.rs", "pub mod recheck;\n".to_owned()),
        (
            "backends/redis/waiting/recheck.rs",
            "use crate::backends::redis::calls::requests::Answer;\n\
             use crate::backends::redis::RedisBackend;\n\
             impl RedisBackend {\n    pub fn key_is_free(&self) -> Option<Answer> { None }\n}\n"
                .to_owned(),
        ),
    ];
    for (path, text) in files {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("temp dir");
        std::fs::write(&path, text).expect("write a planted file");
    }
    src
}

/// The imports (and method calls) up a backend's floors in the crate at
/// `src`, and how many references cross between floors at all.
fn backend_floor_breaks(src: &Path) -> (Vec<String>, usize) {
    let (references, _) = resolved_references_in(src);
    let files = file_modules_in(src);
    let mut broken = Vec::new();
    let mut crossing = 0;
    for (backend, floors) in BACKEND_FLOORS {
        let unit_of = |module: &[String]| -> Option<String> {
            match module {
                [top, name, unit, ..] if top == "backends" && name == backend => Some(unit.clone()),
                _ => None,
            }
        };
        for file in &files {
            if let Some(unit) = unit_of(file)
                && !floors.iter().any(|(u, _)| *u == unit)
            {
                broken.push(format!(
                        "backends/{backend}/{unit} is on none of {backend}'s floors: add it to BACKEND_FLOORS"
                    ));
            }
        }
        for (module, reference) in &references {
            // An item of the root file (the backend type, its helpers) is
            // the parent link, not a floor: only a file's target counts.
            let target = file_of(&files, &reference.target);
            let (Some(from), Some(to)) = (unit_of(module), unit_of(&target)) else {
                continue; // the root's and outsiders' references
            };
            if from == to {
                continue;
            }
            crossing += 1;
            let allowed = floors
                .iter()
                .find(|(u, _)| *u == from)
                .map_or(&[][..], |(_, a)| *a);
            if !allowed.contains(&to.as_str()) {
                broken.push(format!(
                    "{} uses `{}`: `{backend}::{from}` may use only [{}], not `{to}` (move what it needs down, or this code up)",
                    reference.file,
                    reference.written,
                    allowed.join(", ")
                ));
            }
        }
    }
    broken.sort();
    broken.dedup();
    (broken, crossing)
}

/// The group of a backend's files: the backend's name.
fn backend_group(module: &[String]) -> Option<String> {
    match module {
        [top, name, ..] if top == "backends" => Some(name.clone()),
        _ => None,
    }
}

/// An import graph: `from -> to` with one import that draws it.
type Edges = BTreeMap<(String, String), String>;

fn add_edge(edges: &mut Edges, from: String, to: String, file: &str, written: &str) {
    edges
        .entry((from, to))
        .or_insert_with(|| format!("{file} imports `{written}`"));
}

/// The graph of `node`s that the library's references draw.
fn unit_edges(node: fn(&[String]) -> String) -> Edges {
    let (references, _) = resolved_references("dlock");
    let mut edges = Edges::new();
    for (module, reference) in &references {
        let (from, to) = (node(module), node(&reference.target));
        if !module.is_empty() && from != to && to != "crate" {
            add_edge(&mut edges, from, to, &reference.file, &reference.written);
        }
    }
    edges
}

/// The graph of files of `krate` whose `group` is the same (a backend's
/// files, or the whole crate). A file's use of a module it is declared in,
/// or the reverse, is left out: that is the parent ↔ child link (a child
/// adds `impl` blocks to its parent's types and uses its shared state),
/// not an import between siblings. So are method calls: the files of one
/// floor extend one type and call each other's methods both ways (a
/// semaphore's renewal and its acquire); between floors the floors check
/// sees them.
fn file_edges(krate: &str, group: fn(&[String]) -> Option<String>) -> Edges {
    file_edges_in(&source_dir(krate), group)
}

/// [`file_edges`] of the crate whose sources are in `src`.
fn file_edges_in(src: &Path, group: fn(&[String]) -> Option<String>) -> Edges {
    let files = file_modules_in(src);
    let file_of = |target: &[String]| file_of(&files, target);
    let (references, _) = resolved_references_in(src);
    let mut edges = Edges::new();
    for (module, reference) in &references {
        if reference.method {
            continue;
        }
        let (from, to) = (file_of(module), file_of(&reference.target));
        let related = from.starts_with(&to) || to.starts_with(&from);
        let same_group = group(&from).is_some() && group(&from) == group(&to);
        if !related && same_group {
            add_edge(
                &mut edges,
                from.join("::"),
                to.join("::"),
                &reference.file,
                &reference.written,
            );
        }
    }
    edges
}

/// The file a path lands in: the longest file module it starts with.
fn file_of(files: &BTreeSet<Vec<String>>, target: &[String]) -> Vec<String> {
    (0..=target.len())
        .rev()
        .map(|n| target[..n].to_vec())
        .find(|m| files.contains(m))
        .unwrap_or_default()
}

/// Fails on any cycle in `edges`, naming an import for each of its steps;
/// `at_least` edges are expected (fewer: the scanner is broken).
fn assert_no_cycles(what: &str, edges: Edges, at_least: usize) {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from.clone()).or_default().insert(to.clone());
    }
    println!(
        "{what}: {} import others, {} edges",
        graph.len(),
        edges.len()
    );
    assert!(
        edges.len() >= at_least,
        "only {} edges between {what}: the scanner is broken",
        edges.len()
    );
    if std::env::var_os("DUMP_EDGES").is_some() {
        for ((a, b), w) in &edges {
            eprintln!("EDGE {a} {b} {w}");
        }
    }
    let found = cycles(&graph, 10_000);
    let shown: Vec<String> = found
        .iter()
        .take(20)
        .map(|c| {
            let steps: Vec<String> = c
                .iter()
                .zip(c.iter().cycle().skip(1))
                .map(|(a, b)| format!("  {a} -> {b}: {}", edges[&(a.clone(), b.clone())]))
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
