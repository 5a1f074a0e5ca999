//! The layer rule of `docs/architecture.md` and "no import cycle, even inside a folder", checked
//! on every test run by `tools/import-cycles.py` (it reads `use` trees with their groups, so
//! `use super::{a::B, c}` counts, and follows re-exports to the file that defines a name).

use std::process::Command;

#[test]
fn no_import_cycle_and_no_layer_breach() {
    let out = Command::new("python3")
        .arg("tools/import-cycles.py")
        .arg("src")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("python3 runs tools/import-cycles.py");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tools/import-cycles.py src found cycles or layer breaches:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(" 0 cycles, 0 layer breaches"), "{text}");
    eprintln!("{}", text.trim());
}

/// The tool itself: a grouped `use super::{…}` that closes a cycle, and an import from a lower
/// layer, are both found.
#[test]
fn the_checker_sees_grouped_imports_and_breaches() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("coord/x")).unwrap();
    std::fs::create_dir_all(src.join("net")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod coord;\npub mod net;\n").unwrap();
    std::fs::write(src.join("coord/mod.rs"), "pub mod x;\n").unwrap();
    std::fs::write(
        src.join("coord/x/mod.rs"),
        "mod a;\nmod b;\npub use a::A;\npub use b::B;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("coord/x/a.rs"),
        "use super::{B, b};\npub struct A;\n",
    )
    .unwrap();
    std::fs::write(src.join("coord/x/b.rs"), "use super::A;\npub struct B;\n").unwrap();
    std::fs::write(src.join("net/mod.rs"), "pub struct N;\n").unwrap();
    let run = |extra: Option<&str>| {
        if let Some(code) = extra {
            std::fs::write(src.join("coord/mod.rs"), code).unwrap();
        }
        let out = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tools/import-cycles.py"
            ))
            .arg(&src)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (ok, text) = run(None);
    assert!(!ok, "{text}");
    assert!(text.contains("cycle of 2: coord/x/a coord/x/b"), "{text}");
    // Cut the cycle; then a core module using a driver is a breach.
    std::fs::write(src.join("coord/x/b.rs"), "pub struct B;\n").unwrap();
    let (ok, text) = run(None);
    assert!(ok, "{text}");
    let (ok, text) = run(Some("pub mod x;\nuse crate::net::N;\n"));
    assert!(!ok, "{text}");
    assert!(text.contains("layer breach: coord uses net"), "{text}");
}
