//! The scanner behind `layers.rs`: reads a crate's `src/**/*.rs` with
//! `syn` and collects each reference into the crate (`use` trees,
//! `crate::`/`super::`/`self::` paths, and the same inside macro calls),
//! resolved to the module it names, and each call of a method through
//! `self` or `Self::` resolved to the file whose inherent `impl` defines
//! it; and the cycle finder its tests share.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// One reference from a file into the crate.
pub(crate) struct Reference {
    pub(crate) file: String,
    /// As written (`crate::inspect::holder_of`).
    pub(crate) written: String,
    /// The module path it names, resolved (`["inspect", "holder_of"]`).
    pub(crate) target: Vec<String>,
    /// A method call through `self.` or `Self::`, not a path.
    pub(crate) method: bool,
}

/// A call of a method through `self.` or `Self::` inside an `impl` of a
/// type: the type, the method, and the module the call is in.
struct MethodCall {
    file: String,
    type_name: String,
    method: String,
    module: Vec<String>,
}

/// What one file contributes.
struct Parsed {
    module: Vec<String>,
    references: Vec<Reference>,
    /// Methods defined in inherent `impl`s here: (type, method) → module.
    methods: Vec<((String, String), Vec<String>)>,
    /// Calls of methods through `self.` or `Self::`.
    calls: Vec<MethodCall>,
    /// Modules declared here under `#[cfg(test)]`: test-only files.
    test_modules: Vec<Vec<String>>,
    /// `pub use` at the crate root: name → the path it re-exports.
    root_aliases: BTreeMap<String, Vec<String>>,
}

/// The workspace checked: this one, or the one `LAYERS_CHECK_ROOT` names
/// (to measure another checkout, e.g. an older commit, with this test).
pub(crate) fn workspace_root() -> PathBuf {
    match std::env::var_os("LAYERS_CHECK_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace holds dlock/")
            .to_owned(),
    }
}

/// The sources of the workspace's crate `krate` (`dlock`, `dlock-macros`).
pub(crate) fn source_dir(krate: &str) -> PathBuf {
    workspace_root().join(krate).join("src")
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// The module of every source file under `src`.
pub(crate) fn file_modules_in(src: &Path) -> BTreeSet<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .iter()
        .map(|f| module_of(f.strip_prefix(src).expect("under src")))
        .collect()
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
    /// The type whose `impl` (inherent or of a trait) is being visited.
    impl_type: Option<String>,
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
                method: false,
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
        if let (true, Some(name)) = (public_root, name)
            && let Some(target) = self.resolve(full)
        {
            self.out.root_aliases.insert(name, target);
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
        if let syn::ImplItem::Fn(f) = item
            && is_cfg_test(&f.attrs)
        {
            return;
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let syn::Type::Path(ty) = &*i.self_ty else {
            return syn::visit::visit_item_impl(self, i);
        };
        let Some(name) = ty.path.segments.last().map(|s| s.ident.to_string()) else {
            return syn::visit::visit_item_impl(self, i);
        };
        if i.trait_.is_none() {
            for item in &i.items {
                if let syn::ImplItem::Fn(f) = item
                    && !is_cfg_test(&f.attrs)
                {
                    self.out
                        .methods
                        .push(((name.clone(), f.sig.ident.to_string()), self.module.clone()));
                }
            }
        }
        let outer = self.impl_type.replace(name);
        syn::visit::visit_item_impl(self, i);
        self.impl_type = outer;
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if let (Some(type_name), syn::Expr::Path(receiver)) = (&self.impl_type, &*call.receiver)
            && receiver.path.is_ident("self")
        {
            self.out.calls.push(MethodCall {
                file: self.file.to_owned(),
                type_name: type_name.clone(),
                method: call.method.to_string(),
                module: self.module.clone(),
            });
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let (Some(type_name), syn::Expr::Path(func)) = (&self.impl_type, &*call.func)
            && let [first, method] = func.path.segments.iter().collect::<Vec<_>>()[..]
            && first.ident == "Self"
        {
            self.out.calls.push(MethodCall {
                file: self.file.to_owned(),
                type_name: type_name.clone(),
                method: method.ident.to_string(),
                module: self.module.clone(),
            });
        }
        syn::visit::visit_expr_call(self, call);
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

fn parse_crate(src: &Path) -> (Vec<Parsed>, usize) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let relative: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(src).expect("under src").to_owned())
        .collect();
    let krate = src
        .parent()
        .and_then(|p| p.file_name())
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let known: BTreeSet<Vec<String>> = relative.iter().map(|r| module_of(r)).collect();
    let mut parsed = Vec::new();
    for (path, rel) in files.iter().zip(&relative) {
        let text = std::fs::read_to_string(path).expect("readable source");
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let shown = format!("{krate}/src/{}", rel.display());
        let mut collector = Collector {
            file: &shown,
            module: module_of(rel),
            known: &known,
            impl_type: None,
            out: Parsed {
                module: module_of(rel),
                references: Vec::new(),
                methods: Vec::new(),
                calls: Vec::new(),
                test_modules: Vec::new(),
                root_aliases: BTreeMap::new(),
            },
        };
        collector.visit_file(&ast);
        parsed.push(collector.out);
    }
    (parsed, files.len())
}

/// Every reference of non-test code with the module it points at, root
/// re-exports followed (`crate::LockError` → `backend::error::LockError`),
/// and every method call through `self.` or `Self::` whose method one
/// file's inherent `impl` of that type defines (written `self.name()`,
/// pointing at that file's module and the method): a call across floors
/// ties them as an import does, though no `use` shows it.
pub(crate) fn resolved_references(krate: &str) -> (Vec<(Vec<String>, Reference)>, usize) {
    resolved_references_in(&source_dir(krate))
}

/// [`resolved_references`] of the crate whose sources are in `src`.
pub(crate) fn resolved_references_in(src: &Path) -> (Vec<(Vec<String>, Reference)>, usize) {
    let (parsed, files) = parse_crate(src);
    let aliases: BTreeMap<String, Vec<String>> =
        parsed.iter().flat_map(|p| p.root_aliases.clone()).collect();
    let test_only: Vec<Vec<String>> = parsed.iter().flat_map(|p| p.test_modules.clone()).collect();
    let is_test = |module: &[String]| test_only.iter().any(|t| module.starts_with(t));
    // (type, method) → the modules defining it; a name two types share
    // (two `State`s in two modules) is ambiguous and left out.
    let mut defined: BTreeMap<(String, String), BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &parsed {
        for (key, module) in &file.methods {
            if !is_test(module) {
                defined
                    .entry(key.clone())
                    .or_default()
                    .insert(module.clone());
            }
        }
    }
    let mut out = Vec::new();
    for file in parsed {
        if is_test(&file.module) {
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
        for call in file.calls {
            let key = (call.type_name, call.method);
            let Some(modules) = defined.get(&key).filter(|m| m.len() == 1) else {
                continue; // a trait's method, std's, or ambiguous
            };
            let mut target = modules.iter().next().cloned().unwrap_or_default();
            target.push(key.1.clone());
            out.push((
                call.module,
                Reference {
                    file: call.file,
                    written: format!("self.{}()", key.1),
                    target,
                    method: true,
                },
            ));
        }
    }
    (out, files)
}

/// Every elementary cycle of a small directed graph (each once, starting at
/// its least node), at most `limit`.
pub(crate) fn cycles(edges: &BTreeMap<String, BTreeSet<String>>, limit: usize) -> Vec<Vec<String>> {
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
