//! The import graph between the source files of each crate has no circles: a file that
//! names another (a `use`, or a path such as `crate::x::f()` in its code) depends on it,
//! and no file depends on itself through others. A circle is where "which floor is
//! this on" has no answer: the ground-floor types and the code that loads them, two
//! stores reaching into each other's rows. The files are parsed with `syn`; unit tests
//! (`#[cfg(test)]`) are left out, since they wire what they test like a binary does.
//! A module's paths into its own submodules (declarations, re-exports) are its
//! structure, not a dependency, so they are not edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use syn::visit::Visit;

use crate::layout::{rust_files, workspace};

/// One crate's files: `root` is its `src/`, `aliases` the names other crates reach
/// it by (`einmal` for the library), which inside it mean `crate`.
struct Tree {
    root: PathBuf,
    aliases: Vec<String>,
    /// Module path (`["adapters", "embedded", "inbox"]`) to file (relative to `root`).
    modules: BTreeMap<Vec<String>, String>,
}

impl Tree {
    fn new(root: PathBuf, aliases: &[&str], files: Vec<String>) -> Self {
        let modules = files
            .into_iter()
            .map(|file| (module_of(&file), file))
            .collect();
        Self {
            root,
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
            modules,
        }
    }

    /// The file → files it depends on, within this crate.
    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (module, file) in &self.modules {
            let text = std::fs::read_to_string(self.root.join(file)).expect("source is readable");
            let parsed = syn::parse_file(&text).unwrap_or_else(|e| {
                panic!("{} does not parse: {e}", self.root.join(file).display())
            });
            let mut paths = Paths::default();
            paths.visit_file(&parsed);
            let targets: BTreeSet<String> = paths
                .0
                .iter()
                .filter_map(|path| self.resolve(module, path))
                .filter(|target| !target.starts_with(module.as_slice()))
                .filter_map(|target| self.modules.get(&target).cloned())
                .collect();
            edges.insert(file.clone(), targets);
        }
        edges
    }

    /// The deepest module of this crate that `path`, written in `module`, names.
    fn resolve(&self, module: &[String], path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let (mut base, rest) = if first == "crate" || self.aliases.contains(first) {
            (Vec::new(), &path[1..])
        } else if first == "self" {
            (module.to_vec(), &path[1..])
        } else if first == "super" {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = module[..module.len().checked_sub(ups)?].to_vec();
            (base, &path[ups..])
        } else {
            // A child module named without `self::` (2018 paths); anything else is
            // another crate.
            let mut child = module.to_vec();
            child.push(first.clone());
            if !self.modules.contains_key(&child) {
                return None;
            }
            (module.to_vec(), path)
        };
        let mut deepest = self.modules.contains_key(&base).then(|| base.clone());
        for segment in rest {
            base.push(segment.clone());
            if !self.modules.contains_key(&base) {
                break;
            }
            deepest = Some(base.clone());
        }
        deepest
    }
}

/// The circles of `edges`: strongly connected components of more than one file.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    strongly_connected(edges)
        .into_iter()
        .filter(|component| component.len() > 1)
        .collect()
}

/// `lib.rs` and `main.rs` are the root; `a/mod.rs` is `a`; `a/b.rs` is `a::b`.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every path a file's production code names: each `use` tree flattened, and every
/// path in expressions, types and patterns.
#[derive(Default)]
struct Paths(Vec<Vec<String>>);

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push([prefix.as_slice(), &[n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.as_slice(), &[r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                flatten(item, prefix, out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Trait(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        flatten(&item.tree, &mut Vec::new(), &mut self.0);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.0
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// Tarjan's algorithm: the strongly connected components of `edges`.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        components: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    component.push(top.to_string());
                    if top == node {
                        break;
                    }
                }
                component.sort();
                self.components.push(component);
            }
        }
    }
    let mut search = Search {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for node in edges.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.components
}

/// The crate whose sources are `dir` (relative to the workspace), without `bin/`
/// (each binary there is a crate of its own, one file).
fn workspace_tree(dir: &str, aliases: &[&str]) -> Tree {
    let prefix = format!("{dir}/");
    let files = rust_files(dir)
        .into_iter()
        .map(|f| f.strip_prefix(&prefix).expect("below dir").to_string())
        .filter(|f| !f.starts_with("bin/"))
        .collect();
    Tree::new(workspace().join(dir), aliases, files)
}

#[test]
fn the_scanner_finds_a_circle_through_uses_and_code_paths_but_not_through_tests() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = [
        (
            "lib.rs",
            "pub mod a; pub mod b; pub mod c; pub mod d; pub use a::A;",
        ),
        (
            "a.rs",
            "use crate::b::{self, B};\npub struct A;\npub fn f() { crate::c::g(); }",
        ),
        (
            "b.rs",
            "pub struct B;\npub fn f() -> mylib::a::A { super::a::A }",
        ),
        (
            "c.rs",
            "pub fn g() {}\n#[cfg(test)]\nmod tests { use crate::a::A; }",
        ),
        (
            "d.rs",
            "use std::sync::Arc;\npub fn h() -> Arc<crate::c::G> { todo!() }",
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    let tree = Tree::new(
        dir.path().to_path_buf(),
        &["mylib"],
        files.iter().map(|(name, _)| name.to_string()).collect(),
    );
    let edges = tree.edges();
    assert_eq!(
        edges["a.rs"],
        BTreeSet::from(["b.rs".to_string(), "c.rs".to_string()])
    );
    assert_eq!(edges["b.rs"], BTreeSet::from(["a.rs".to_string()]));
    assert!(edges["c.rs"].is_empty(), "a unit test's use is no edge");
    assert_eq!(edges["d.rs"], BTreeSet::from(["c.rs".to_string()]));
    assert!(edges["lib.rs"].is_empty(), "re-exports are structure");
    assert_eq!(
        circles(&edges),
        vec![vec!["a.rs".to_string(), "b.rs".to_string()]]
    );
}

#[test]
fn no_crate_has_a_circle_in_its_import_graph() {
    let mut trees = vec![
        (
            "shared/src".to_string(),
            workspace_tree("shared/src", &["einmal"]),
        ),
        (
            "cli/src".to_string(),
            workspace_tree("cli/src", &["einmal_cli"]),
        ),
    ];
    for function in ["receiver", "processor", "sweeper", "reconciler"] {
        let dir = format!("functions/{function}/src");
        let tree = workspace_tree(&dir, &[function]);
        trees.push((dir, tree));
    }
    let mut found = Vec::new();
    for (dir, tree) in &trees {
        assert!(
            tree.modules.len() > 1 || dir.starts_with("functions/"),
            "{dir} read"
        );
        let edges = tree.edges();
        for circle in circles(&edges) {
            let ties: Vec<String> = circle
                .iter()
                .flat_map(|from| {
                    edges[from]
                        .iter()
                        .filter(|to| circle.contains(to))
                        .map(move |to| format!("{from} -> {to}"))
                })
                .collect();
            found.push(format!("{dir}: {}", ties.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "circles in the import graph:\n{}",
        found.join("\n")
    );
}
