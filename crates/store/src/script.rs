//! `source.script` JukeBoxes: a Rhai script returns the repository list
//! (reference §3.2). The engine is sandboxed (bounded operations, no modules);
//! a script error or a wrong return type is a condition, never a crash.

const MAX_OPERATIONS: u64 = 1_000_000;

/// The `registry/repository` strings the script returns.
pub fn repositories(source: &str) -> Result<Vec<String>, String> {
    let mut engine = rhai::Engine::new();
    engine.set_max_operations(MAX_OPERATIONS);
    engine.set_max_string_size(64 * 1024);
    engine.set_max_array_size(100_000);
    let value: rhai::Dynamic = engine.eval(source).map_err(|e| format!("the source script failed: {e}"))?;
    let array = value.try_cast::<rhai::Array>().ok_or_else(|| {
        "the source script must return an array of \"registry/repository\" strings".to_string()
    })?;
    array
        .into_iter()
        .map(|item| {
            item.into_string().map_err(|t| {
                format!(
                    "the source script returned a {t} where a \"registry/repository\" string was expected"
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_returns_its_repositories() {
        let list =
            repositories(r#"let r = []; for n in ["a", "b"] { r.push(`docker.io/sebt3/vynil-${n}`) } r"#)
                .unwrap();
        assert_eq!(list, ["docker.io/sebt3/vynil-a", "docker.io/sebt3/vynil-b"]);
    }

    #[test]
    fn script_errors_are_messages_not_crashes() {
        assert!(repositories("let x = ;").unwrap_err().contains("failed"));
        assert!(repositories("42").unwrap_err().contains("must return an array"));
        assert!(repositories("[1, 2]").unwrap_err().contains("returned a i64"));
        assert!(repositories("loop { }").unwrap_err().contains("failed"), "bounded operations");
    }
}
