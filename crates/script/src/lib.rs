//! The sealed engine for scripts that come from the cluster. A
//! `source.script` JukeBox's Rhai script returns the repository list
//! (upstream's `source.script`); a package's `value_script` and `prefly`
//! run in lifecycle. Each comes from the cluster, so it runs sandboxed: a raw engine with only the standard language packages (no
//! module resolver, so `import` cannot read the scanner's files; no `eval`),
//! and limits on operations, call depth, expression depth, string, array and
//! map sizes and wall time. A script error, a limit or a wrong return type is
//! a condition, never a crash. Lifecycle builds its engine from the same
//! sealed one ([`ScriptLimits::sandbox`]).

use std::time::{Duration, Instant};

use rhai::{EvalAltResult, packages::Package};

const MAX_TIME: Duration = Duration::from_secs(2);

/// How much work a cluster-provided script may do: `--max-script-operations`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptLimits {
    max_operations: u64,
}

impl Default for ScriptLimits {
    fn default() -> Self {
        Self { max_operations: Self::DEFAULT_MAX_OPERATIONS }
    }
}

impl ScriptLimits {
    /// `--max-script-operations`'s default.
    pub const DEFAULT_MAX_OPERATIONS: u64 = 1_000_000;

    pub fn new(max_operations: u64) -> Self {
        Self { max_operations: max_operations.max(1) }
    }

    /// The sealed engine every cluster-provided script runs in (JukeBox
    /// `source.script`, package `value_script` and `prefly`).
    pub fn sandbox(self) -> rhai::Engine {
        let mut engine = rhai::Engine::new_raw();
        engine.register_global_module(rhai::packages::StandardPackage::new().as_shared_module());
        engine.disable_symbol("eval");
        engine.set_max_operations(self.max_operations);
        engine.set_max_call_levels(32);
        engine.set_max_expr_depths(64, 32);
        engine.set_max_string_size(64 * 1024);
        engine.set_max_array_size(100_000);
        engine.set_max_map_size(10_000);
        let started = Instant::now();
        engine.on_progress(move |_| (started.elapsed() > MAX_TIME).then(|| "time limit".into()));
        engine
    }

    /// A script's failure in words, the operation limit named with its flag
    /// when that is what stopped it.
    pub fn failure(self, error: &EvalAltResult) -> String {
        match error {
            EvalAltResult::ErrorTooManyOperations(_) => format!(
                "{error} (over {} operations: raise --max-script-operations if the script is right)",
                self.max_operations
            ),
            other => other.to_string(),
        }
    }

    /// The `registry/repository` strings a JukeBox's `source.script` returns.
    pub fn repositories(self, source: &str) -> Result<Vec<String>, String> {
        let value: rhai::Dynamic = self
            .sandbox()
            .eval(source)
            .map_err(|e| format!("the source script failed: {}", self.failure(&e)))?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repositories(source: &str) -> Result<Vec<String>, String> {
        ScriptLimits::default().repositories(source)
    }

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

    #[test]
    fn a_script_cannot_import_the_scanners_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret.rhai"), r#"export const value = "stolen/secret";"#).unwrap();
        let path = dir.path().join("secret").to_string_lossy().into_owned();
        let error = repositories(&format!("import {path:?} as s; [s::value]")).unwrap_err();
        assert!(error.contains("failed") && error.contains("secret"), "{error}");
    }

    #[test]
    fn eval_deep_recursion_and_huge_values_are_refused() {
        assert!(repositories(r#"eval("[\"a/b\"]")"#).is_err(), "eval is disabled");
        assert!(repositories("fn f(n) { f(n + 1) } f(0)").unwrap_err().contains("failed"));
        assert!(repositories(r#"let s = "x"; loop { s += s; }"#).unwrap_err().contains("failed"));
    }
}
