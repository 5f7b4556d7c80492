//! Tasks: the prompt template (minijinja, strict undefined variables), the
//! input and output JSON Schemas, golden-example expectations, and the hashes
//! a qualification is bound to. Compiled once at start.

use std::collections::HashMap;
use std::sync::Arc;

use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value;

use crate::config::{Config, ProviderConfig, ProviderKind, TaskConfig};
use crate::domain::fingerprint::{canonical_json, sha256_hex};

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env
}

fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}

/// Checks a task's template, schemas and golden examples; the error names the
/// key (relative to the task) and what is wrong.
pub fn check_task(task: &TaskConfig) -> Result<(), (String, String)> {
    if let Some(template) = &task.template {
        environment()
            .template_from_str(template)
            .map_err(|e| ("template".to_owned(), format!("does not parse: {e}")))?;
    }
    for (key, schema) in [
        ("input_schema", &task.input_schema),
        ("output_schema", &task.output_schema),
    ] {
        if let Some(schema) = schema {
            compile_schema(schema).map_err(|e| (key.to_owned(), e))?;
        }
    }
    // Qualification runs at this temperature, and it must be a low one.
    if !(0.0..=0.5).contains(&task.temperature) {
        return Err((
            "temperature".into(),
            "must be between 0 and 0.5 (qualification runs at a low temperature)".into(),
        ));
    }
    for (i, golden) in task.golden.iter().enumerate() {
        for pointer in golden.expect.keys() {
            if !pointer.is_empty() && !pointer.starts_with('/') {
                return Err((
                    format!("golden[{i}].expect"),
                    format!("{pointer:?} is not a JSON Pointer (start it with '/')"),
                ));
            }
        }
    }
    Ok(())
}

/// A task ready to use: validators compiled, hashes computed.
pub struct TaskSpec {
    pub config: TaskConfig,
    input_validator: Option<jsonschema::Validator>,
    output_validator: Option<jsonschema::Validator>,
    /// SHA-256 of the template text ("" when there is none).
    pub template_sha256: String,
    /// SHA-256 of the canonical JSON of the output schema (`null` when none).
    pub output_schema_sha256: String,
}

impl TaskSpec {
    pub fn new(config: &TaskConfig) -> Result<Self, String> {
        let compile = |schema: &Option<Value>| schema.as_ref().map(compile_schema).transpose();
        Ok(Self {
            input_validator: compile(&config.input_schema)?,
            output_validator: compile(&config.output_schema)?,
            template_sha256: sha256_hex(config.template.as_deref().unwrap_or("").as_bytes()),
            output_schema_sha256: sha256_hex(
                canonical_json(config.output_schema.as_ref().unwrap_or(&Value::Null)).as_bytes(),
            ),
            config: config.clone(),
        })
    }

    /// Renders the prompt for an input; undefined variables are errors.
    pub fn render_prompt(&self, input: &Value) -> Result<String, String> {
        match &self.config.template {
            Some(template) => environment()
                .render_str(
                    template,
                    minijinja::Value::from(minijinja::value::Serde(input)),
                )
                .map(|p| p.trim().to_owned())
                .map_err(|e| format!("the template does not render: {e}")),
            // Without a template the provider receives the input itself.
            None => Ok(canonical_json(input)),
        }
    }

    pub fn check_input(&self, input: &Value) -> Result<(), String> {
        check_against(self.input_validator.as_ref(), input, "the input")
    }

    pub fn check_output(&self, output: &Value) -> Result<(), String> {
        check_against(self.output_validator.as_ref(), output, "the answer")
    }
}

fn check_against(
    validator: Option<&jsonschema::Validator>,
    value: &Value,
    what: &str,
) -> Result<(), String> {
    let Some(validator) = validator else {
        return Ok(());
    };
    let errors: Vec<String> = validator
        .iter_errors(value)
        .take(5)
        .map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{at}: {e}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what} does not match its schema: {}",
            errors.join("; ")
        ))
    }
}

/// Golden expectations that do not hold: `pointer: expected X, got Y`.
pub fn golden_mismatches(
    expect: &std::collections::BTreeMap<String, Value>,
    answer: &Value,
) -> Vec<String> {
    expect
        .iter()
        .filter_map(|(pointer, expected)| match answer.pointer(pointer) {
            Some(actual) if actual == expected => None,
            Some(actual) => Some(format!("{pointer}: expected {expected}, got {actual}")),
            None => Some(format!("{pointer}: expected {expected}, but it is missing")),
        })
        .collect()
}

/// How many tokens a prompt takes with this provider, and how it was counted.
pub fn count_tokens(provider: &ProviderConfig, text: &str) -> (u32, &'static str) {
    if provider.kind == ProviderKind::Openai {
        let bpe = provider
            .model
            .as_deref()
            .and_then(|m| tiktoken_rs::bpe_for_model(m).ok())
            .unwrap_or_else(|| tiktoken_rs::o200k_base_singleton());
        return (
            bpe.encode_with_special_tokens(text).len() as u32,
            "tiktoken",
        );
    }
    // No Rust tokenizer for this provider: a conservative estimate, one token
    // per three bytes of UTF-8 (English runs about four characters a token).
    (
        text.len().div_ceil(3) as u32,
        "estimate: 1 token per 3 bytes",
    )
}

/// Every configured task, compiled.
#[derive(Clone)]
pub struct Tasks {
    specs: Arc<HashMap<String, Arc<TaskSpec>>>,
}

impl Tasks {
    /// Compiles every task (the configuration was validated, so this succeeds).
    pub fn from_config(config: &Config) -> Self {
        let specs = config
            .tasks
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    Arc::new(TaskSpec::new(t).expect("validated task")),
                )
            })
            .collect();
        Self {
            specs: Arc::new(specs),
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<TaskSpec>> {
        self.specs.get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(template: Option<&str>, output_schema: Option<Value>) -> TaskSpec {
        TaskSpec::new(&TaskConfig {
            name: "t".into(),
            providers: vec!["p".into()],
            input_fields: vec![],
            template: template.map(str::to_owned),
            input_schema: None,
            output_schema,
            temperature: 0.0,
            golden: vec![],
        })
        .unwrap()
    }

    #[test]
    fn templates_render_with_the_inputs_fields() {
        let t = task(Some("Summarize: {{ text }}"), None);
        assert_eq!(
            t.render_prompt(&json!({"text": "hi"})).unwrap(),
            "Summarize: hi"
        );
    }

    #[test]
    fn an_undefined_variable_is_an_error_not_an_empty_string() {
        let t = task(Some("Summarize: {{ txt }}"), None);
        assert!(t.render_prompt(&json!({"text": "hi"})).is_err());
    }

    #[test]
    fn a_forbidden_extra_top_level_key_fails_the_output_schema() {
        let schema = json!({"type": "object", "required": ["summary"], "additionalProperties": false,
                            "properties": {"summary": {"type": "string"}}});
        let t = task(None, Some(schema));
        assert!(t.check_output(&json!({"summary": "ok"})).is_ok());
        let error = t
            .check_output(&json!({"summary": "ok", "confidence": 0.9}))
            .unwrap_err();
        assert!(error.contains("confidence"), "{error}");
    }

    #[test]
    fn changing_the_template_or_schema_changes_the_hashes() {
        let a = task(Some("A {{ x }}"), Some(json!({"type": "object"})));
        let b = task(Some("B {{ x }}"), Some(json!({"type": "object"})));
        let c = task(Some("A {{ x }}"), Some(json!({"type": "array"})));
        assert_ne!(a.template_sha256, b.template_sha256);
        assert_eq!(a.output_schema_sha256, b.output_schema_sha256);
        assert_ne!(a.output_schema_sha256, c.output_schema_sha256);
    }

    #[test]
    fn golden_expectations_compare_values_at_json_pointers() {
        let expect = [("/label".to_owned(), json!("positive"))]
            .into_iter()
            .collect();
        assert!(golden_mismatches(&expect, &json!({"label": "positive"})).is_empty());
        assert_eq!(
            golden_mismatches(&expect, &json!({"label": "negative"})).len(),
            1
        );
        assert!(golden_mismatches(&expect, &json!({}))[0].contains("missing"));
    }

    #[test]
    fn invalid_templates_and_schemas_are_refused_with_their_key() {
        let mut config = TaskConfig {
            name: "t".into(),
            providers: vec![],
            input_fields: vec![],
            template: Some("{{ unclosed".into()),
            input_schema: None,
            output_schema: None,
            temperature: 0.0,
            golden: vec![],
        };
        assert_eq!(check_task(&config).unwrap_err().0, "template");
        config.template = None;
        config.output_schema = Some(json!({"type": 12}));
        assert_eq!(check_task(&config).unwrap_err().0, "output_schema");
    }

    #[test]
    fn openai_prompts_are_counted_with_tiktoken_and_others_conservatively() {
        let mut provider: ProviderConfig =
            toml::from_str("name = \"p\"\nkind = \"openai\"\nmodel = \"gpt-4o\"").unwrap();
        let (tokens, method) = count_tokens(&provider, "hello world");
        assert_eq!((tokens, method), (2, "tiktoken"));
        provider.kind = ProviderKind::Anthropic;
        let (tokens, _) = count_tokens(&provider, "hello world");
        assert_eq!(tokens, 4, "11 bytes / 3, rounded up");
    }
}
