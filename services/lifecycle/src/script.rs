//! A package's Rhai: `value_script` (a map, the agent's `CONTROLLER_VALUES`)
//! and `prefly` requirements (a truth), both with `instance` bound to the
//! instance object, as upstream's operator evaluates them. They run in the
//! scanner's sealed engine (`vynil_script::ScriptLimits::sandbox`): no modules, no
//! `eval`, bounded work, plus the upstream helpers that are safe there
//! ([`upstream`]). A function we do not provide is an error naming it
//! (Rhai's "Function not found: …", or why upstream's helper of that name is
//! refused), which becomes a condition and no Job.

pub mod upstream;

use rhai::{Dynamic, EvalAltResult, Scope};
use serde_json::Value;
use vynil_script::ScriptLimits;

/// Where one instance's scripts run: the instance, the limits, and what the
/// helpers may read.
#[derive(Debug, Clone)]
pub struct Host {
    instance: Value,
    limits: ScriptLimits,
    given: upstream::Given,
}

impl Host {
    pub fn new(instance: Value, limits: ScriptLimits, given: upstream::Given) -> Self {
        Self { instance, limits, given }
    }

    fn run(&self, source: &str) -> Result<Dynamic, String> {
        let mut engine = self.limits.sandbox();
        upstream::register(&mut engine, &self.given);
        let bound =
            rhai::serde::to_dynamic(&self.instance).map_err(|e| format!("cannot bind `instance`: {e}"))?;
        let mut scope = Scope::new();
        scope.push_constant("instance", bound);
        engine.eval_with_scope(&mut scope, source).map_err(|e| self.failure(&e))
    }

    /// A script's failure in words: a call to an upstream helper this engine
    /// refuses says which and why.
    fn failure(&self, error: &EvalAltResult) -> String {
        let mut cause = error;
        while let EvalAltResult::ErrorInFunctionCall(_, _, inner, _) = cause {
            cause = inner;
        }
        if let EvalAltResult::ErrorFunctionNotFound(signature, position) = cause {
            let name = signature.split([' ', '(']).next().unwrap_or_default();
            if let Some(refusal) = upstream::refusal(name) {
                return format!("{refusal} ({position})");
            }
        }
        self.limits.failure(error)
    }

    /// `CONTROLLER_VALUES`: the map `source` evaluates to, as JSON text;
    /// `{}` without a script.
    pub fn controller_values(&self, source: Option<&str>) -> Result<String, String> {
        let Some(source) = source.filter(|s| !s.trim().is_empty()) else {
            return Ok("{}".into());
        };
        let value = self.run(source)?;
        if !value.is::<rhai::Map>() {
            return Err(format!("it must evaluate to a map, not a {}", value.type_name()));
        }
        let json: Value = rhai::serde::from_dynamic(&value).map_err(|e| e.to_string())?;
        Ok(json.to_string())
    }

    /// Whether a `prefly` expression holds for the instance.
    pub fn prefly(&self, source: &str) -> Result<bool, String> {
        self.run(source)?.as_bool().map_err(|t| format!("it must evaluate to a boolean, not a {t}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(instance: &Value, limits: ScriptLimits) -> Host {
        Host::new(instance.clone(), limits, upstream::Given::default())
    }

    fn controller_values(source: Option<&str>, instance: &Value) -> Result<String, String> {
        host(instance, ScriptLimits::default()).controller_values(source)
    }

    fn prefly(source: &str, instance: &Value) -> Result<bool, String> {
        host(instance, ScriptLimits::default()).prefly(source)
    }
    use serde_json::json;

    #[test]
    fn value_script_sees_the_instance_and_returns_a_map_as_json() {
        let instance = json!({"metadata": {"name": "ollama"}, "spec": {"options": {"gpu": true}}});
        let values = controller_values(
            Some(r#"#{ name: instance.metadata.name, gpu: instance.spec.options.gpu }"#),
            &instance,
        )
        .unwrap();
        assert_eq!(serde_json::from_str::<Value>(&values).unwrap(), json!({"name": "ollama", "gpu": true}));
        assert_eq!(controller_values(None, &instance).unwrap(), "{}");
    }

    #[test]
    fn a_missing_function_or_a_wrong_type_is_an_error_that_names_it() {
        let instance = json!({});
        let missing = controller_values(Some("#{ n: gpu_count() }"), &instance).unwrap_err();
        assert!(missing.contains("gpu_count"), "{missing}");
        assert!(controller_values(Some("42"), &instance).unwrap_err().contains("map"));
        assert!(prefly("1", &instance).unwrap_err().contains("boolean"));
        assert!(prefly("loop {}", &instance).is_err(), "bounded");
    }

    #[test]
    fn prefly_is_evaluated_against_the_instance() {
        let instance = json!({"metadata": {"namespace": "apps"}});
        assert!(prefly(r#"instance.metadata.namespace == "apps""#, &instance).unwrap());
        assert!(!prefly(r#"instance.metadata.namespace == "prod""#, &instance).unwrap());
    }

    #[test]
    fn a_script_over_the_operation_limit_is_stopped_and_names_the_flag() {
        let instance = json!({});
        let counting = "let n = 0; for i in 0..200 { n += i } #{ n: n }";
        let limited = ScriptLimits::new(100);
        assert!(controller_values(Some(counting), &instance).is_ok());
        let error = host(&instance, limited).controller_values(Some(counting)).unwrap_err();
        assert!(
            error.contains("over 100 operations") && error.contains("--max-script-operations"),
            "{error}"
        );
        let error =
            host(&instance, limited).prefly("let n = 0; for i in 0..200 { n += i } n > 0").unwrap_err();
        assert!(error.contains("--max-script-operations"), "{error}");
    }
}
