//! Golden files: expected output kept beside the tests that produce it, so a change in
//! what the code renders shows up as a reviewable diff.

use std::path::Path;

/// Compares `actual` with the file at `path`; with `UPDATE_GOLDEN` set in the
/// environment the file is rewritten instead (review the diff before committing).
/// Callers pass a path under their crate, e.g.
/// `Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/redirect/inpod_v4.golden")`.
pub fn assert_golden(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 creates it)", path.display()));
    assert_eq!(
        actual,
        want,
        "the output differs from {} (UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matching_file_passes_and_a_different_one_fails() {
        // nextest runs each test in a process of its own: this variable is ours alone.
        std::env::remove_var("UPDATE_GOLDEN");
        let dir = std::env::temp_dir().join(format!("golden-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.golden");
        std::fs::write(&path, "one\n").unwrap();
        assert_golden(&path, "one\n");
        let differs = std::panic::catch_unwind(|| assert_golden(&path, "two\n"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(differs.is_err(), "a different output must fail");
    }
}
