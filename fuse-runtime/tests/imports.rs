//! The modules of `fuse-macros` and `fuse-runtime` import one another one way only
//! (doc/ARCHITECTURE.md): no module reaches, through others, back to itself. Read from the source
//! files: a module's imports are the `crate::<module>` paths outside its comments and tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// For each top-level module of the crate at `src`, the other modules it names.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = vec![];
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap();
        let module = first.as_os_str().to_str().unwrap().trim_end_matches(".rs");
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let targets = graph.entry(module.to_string()).or_default();
        for line in code.lines().map(|l| l.split("//").next().unwrap()) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name != module && name.starts_with(|c: char| c.is_lowercase()) {
                    targets.insert(name);
                }
            }
        }
    }
    graph
}

/// Panics with the circle if some module of `graph` reaches itself.
fn assert_no_circle(crate_name: &str, graph: &BTreeMap<String, BTreeSet<String>>) {
    for start in graph.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((module, path)) = stack.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                assert!(
                    next != start,
                    "{crate_name}: import circle {} -> {next}",
                    path.join(" -> ")
                );
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
}

#[test]
fn module_imports_have_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let macros = imports(&root.join("../fuse-macros/src"));
    let runtime = imports(&root.join("src"));
    // Not vacuous: the stages are there, and import what they print or launch from.
    assert!(macros["expand"].contains("plan") && macros["cuda"].contains("plan"));
    assert!(runtime["program"].contains("launch") && runtime["launch"].contains("grid"));
    assert_no_circle("fuse-macros", &macros);
    assert_no_circle("fuse-runtime", &runtime);
}

/// The check finds a circle when there is one.
#[test]
fn a_circle_is_found() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    let found = std::panic::catch_unwind(|| assert_no_circle("test", &graph));
    assert!(found.is_err());
}
