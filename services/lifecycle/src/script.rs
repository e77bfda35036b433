//! A package's Rhai: `value_script` (a map, the agent's `CONTROLLER_VALUES`)
//! and `prefly` requirements (a truth), both with `instance` bound to the
//! instance object, as upstream's operator evaluates them. They run in the
//! scanner's sealed engine (`vynil_store::script::ScriptLimits::sandbox`): no modules, no
//! `eval`, bounded work. A function we do not provide is an error naming it
//! (Rhai's "Function not found: …"), which becomes a condition and no Job.

use rhai::{Dynamic, Scope};
use serde_json::Value;
use vynil_store::script::ScriptLimits;

fn scope(instance: &Value) -> Result<Scope<'static>, String> {
    let bound = rhai::serde::to_dynamic(instance).map_err(|e| format!("cannot bind `instance`: {e}"))?;
    let mut scope = Scope::new();
    scope.push_constant("instance", bound);
    Ok(scope)
}

/// `CONTROLLER_VALUES`: the map `source` evaluates to, as JSON text; `{}`
/// without a script.
pub fn controller_values(
    source: Option<&str>,
    instance: &Value,
    scripts: ScriptLimits,
) -> Result<String, String> {
    let Some(source) = source.filter(|s| !s.trim().is_empty()) else {
        return Ok("{}".into());
    };
    let engine = scripts.sandbox();
    let mut scope = scope(instance)?;
    let value: Dynamic = engine.eval_with_scope(&mut scope, source).map_err(|e| scripts.failure(&e))?;
    if !value.is::<rhai::Map>() {
        return Err(format!("it must evaluate to a map, not a {}", value.type_name()));
    }
    let json: Value = rhai::serde::from_dynamic(&value).map_err(|e| e.to_string())?;
    Ok(json.to_string())
}

/// Whether a `prefly` expression holds for `instance`.
pub fn prefly(source: &str, instance: &Value, scripts: ScriptLimits) -> Result<bool, String> {
    let engine = scripts.sandbox();
    let mut scope = scope(instance)?;
    let value: Dynamic = engine.eval_with_scope(&mut scope, source).map_err(|e| scripts.failure(&e))?;
    value.as_bool().map_err(|t| format!("it must evaluate to a boolean, not a {t}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller_values(source: Option<&str>, instance: &Value) -> Result<String, String> {
        super::controller_values(source, instance, ScriptLimits::default())
    }

    fn prefly(source: &str, instance: &Value) -> Result<bool, String> {
        super::prefly(source, instance, ScriptLimits::default())
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
        assert!(super::controller_values(Some(counting), &instance, ScriptLimits::default()).is_ok());
        let error = super::controller_values(Some(counting), &instance, limited).unwrap_err();
        assert!(
            error.contains("over 100 operations") && error.contains("--max-script-operations"),
            "{error}"
        );
        let error =
            super::prefly("let n = 0; for i in 0..200 { n += i } n > 0", &instance, limited).unwrap_err();
        assert!(error.contains("--max-script-operations"), "{error}");
    }
}
