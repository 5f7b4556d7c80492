//! Task contracts: what a task promises and how a provider's answer is held to
//! it. A contract is the task's definition (from the configuration) compiled
//! once at start: the prompt template (minijinja, strict undefined variables),
//! the input and output JSON Schemas, golden-example expectations, and the
//! hashes a qualification is bound to.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use minijinja::{Environment, UndefinedBehavior};
use serde::Deserialize;
use serde_json::Value;

use crate::domain::{
    canonical_json, failover_order, sha256_hex, OnRateLimit, Outcome, RetryPolicy,
};

/// What a task's input is and what its providers are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// The input's fields fill a prompt template; the answer is JSON held to
    /// the output schema.
    #[default]
    Prompt,
    /// A chat route: the input is an OpenAI Chat Completions request,
    /// passed through to the providers; the answer is the assistant's
    /// message. Clients name the route as their `model`.
    Chat,
}

/// A `[[tasks]]` entry of the configuration, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDefinition {
    pub name: String,
    #[serde(default)]
    pub kind: TaskKind,
    /// Primary first, then fallbacks.
    pub providers: Vec<String>,
    /// Input fields that must be present as non-empty strings (and the fields
    /// of the browser form).
    #[serde(default)]
    pub input_fields: Vec<String>,
    /// The prompt: a minijinja template over the input's fields, with strict
    /// undefined variables. Required when the chain has an HTTP provider.
    pub template: Option<String>,
    /// A JSON Schema every input must satisfy.
    pub input_schema: Option<Value>,
    /// A JSON Schema every answer must satisfy (else the attempt fails with
    /// `invalid_output`); also sent as the structured-output format.
    pub output_schema: Option<Value>,
    /// The low temperature used for qualification.
    #[serde(default)]
    pub temperature: f64,
    /// Examples that qualification runs: an input and expectations on the answer.
    #[serde(default)]
    pub golden: Vec<GoldenExample>,
    /// What a refusal in which nothing happened (a `429`, a `529`, a
    /// provider out of reach) leads to: `failover` to the next qualified
    /// provider, else a retry on the same one; or `wait` for the same one.
    #[serde(default)]
    pub on_rate_limit: OnRateLimit,
    /// The most attempts a job of this task gets without a person:
    /// failovers and retries together, the first attempt included.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// The longest a job's retries may wait in all, in seconds.
    #[serde(default = "default_max_retry_wait_seconds")]
    pub max_retry_wait_seconds: u64,
}

fn default_max_attempts() -> u32 {
    RetryPolicy::DEFAULT_MAX_ATTEMPTS
}

fn default_max_retry_wait_seconds() -> u64 {
    RetryPolicy::DEFAULT_MAX_WAIT_SECONDS
}

impl TaskDefinition {
    /// The task's retry policy and budget.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            on_rate_limit: self.on_rate_limit,
            max_attempts: self.max_attempts,
            max_wait_ms: self.max_retry_wait_seconds.saturating_mul(1000) as i64,
        }
    }
}

/// A golden example: `expect` maps JSON Pointers into the answer (e.g.
/// `"/sentiment"`) to the value they must hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenExample {
    pub input: Value,
    #[serde(default)]
    pub expect: BTreeMap<String, Value>,
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env
}

fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}

impl TaskDefinition {
    /// Checks the template, schemas and golden examples; the error names the
    /// key (relative to the task) and what is wrong.
    pub fn check(&self) -> Result<(), (String, String)> {
        let task = self;
        if task.kind == TaskKind::Chat {
            for (key, set) in [
                ("template", task.template.is_some()),
                ("output_schema", task.output_schema.is_some()),
                ("input_fields", !task.input_fields.is_empty()),
            ] {
                if set {
                    return Err((
                        key.to_owned(),
                        "a chat route passes the client's messages through; it takes no template, \
                     output schema or input fields"
                            .into(),
                    ));
                }
            }
            for (i, golden) in task.golden.iter().enumerate() {
                check_chat_request(&golden.input).map_err(|e| (format!("golden[{i}].input"), e))?;
            }
        }
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
        if !(1..=100).contains(&task.max_attempts) {
            return Err((
                "max_attempts".into(),
                "must be between 1 and 100 (the first attempt counts)".into(),
            ));
        }
        if task.max_retry_wait_seconds > 86_400 {
            return Err((
                "max_retry_wait_seconds".into(),
                "must be at most 86400 (a day)".into(),
            ));
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
}

/// A task ready to use: validators compiled, hashes computed.
pub struct TaskContract {
    pub definition: TaskDefinition,
    input_validator: Option<jsonschema::Validator>,
    output_validator: Option<jsonschema::Validator>,
    /// SHA-256 of the template text ("" when there is none).
    pub template_sha256: String,
    /// SHA-256 of the canonical JSON of the output schema (`null` when none).
    pub output_schema_sha256: String,
}

impl std::fmt::Debug for TaskContract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskContract")
            .field("name", &self.definition.name)
            .field("template_sha256", &self.template_sha256)
            .field("output_schema_sha256", &self.output_schema_sha256)
            .finish()
    }
}

impl TaskContract {
    pub fn compile(config: &TaskDefinition) -> Result<Self, String> {
        let compile = |schema: &Option<Value>| schema.as_ref().map(compile_schema).transpose();
        Ok(Self {
            input_validator: compile(&config.input_schema)?,
            output_validator: compile(&config.output_schema)?,
            template_sha256: sha256_hex(config.template.as_deref().unwrap_or("").as_bytes()),
            output_schema_sha256: sha256_hex(
                canonical_json(config.output_schema.as_ref().unwrap_or(&Value::Null)).as_bytes(),
            ),
            definition: config.clone(),
        })
    }

    pub fn name(&self) -> &str {
        &self.definition.name
    }

    /// The providers of the chain, primary first.
    pub fn chain(&self) -> &[String] {
        &self.definition.providers
    }

    /// The order a job of this task tries providers: the one the user named
    /// (if any), then the chain.
    pub fn failover_order<'a>(&'a self, requested: Option<&'a str>) -> Vec<&'a str> {
        failover_order(&self.definition.providers, requested)
    }

    /// Renders the prompt for an input; undefined variables are errors.
    pub fn render_prompt(&self, input: &Value) -> Result<String, String> {
        match &self.definition.template {
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
        if self.definition.kind == TaskKind::Chat {
            return check_chat_request(input);
        }
        check_against(self.input_validator.as_ref(), input, "the input")
    }

    pub fn is_chat(&self) -> bool {
        self.definition.kind == TaskKind::Chat
    }

    pub fn check_output(&self, output: &Value) -> Result<(), String> {
        check_against(self.output_validator.as_ref(), output, "the answer")
    }

    /// Holds an answer to the contract: a success whose answer does not
    /// satisfy the output schema is a definite failure (`invalid_output`).
    pub fn judge(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Succeeded(answer) => match self.check_output(&answer) {
                Ok(()) => Outcome::Succeeded(answer),
                Err(reason) => {
                    Outcome::Failed(crate::domain::outcome::Reason::invalid_output(reason))
                }
            },
            other => other,
        }
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

/// A chat request's shape: `messages`, a non-empty list of messages with a
/// known role and content.
pub fn check_chat_request(request: &Value) -> Result<(), String> {
    crate::chat::openai_chat::read_request(request)
        .map(drop)
        .map_err(|refused| refused.message)
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

/// Every configured task's contract, in configuration order.
#[derive(Clone, Debug, Default)]
pub struct Contracts {
    ordered: Vec<Arc<TaskContract>>,
    by_name: HashMap<String, Arc<TaskContract>>,
}

impl Contracts {
    /// Compiles every definition; the error names the task's key and what is wrong.
    pub fn compile(definitions: &[TaskDefinition]) -> Result<Self, (String, String)> {
        let mut contracts = Self::default();
        for (i, definition) in definitions.iter().enumerate() {
            let contract = TaskContract::compile(definition)
                .map_err(|message| (format!("tasks[{i}]"), message))?;
            let contract = Arc::new(contract);
            contracts
                .by_name
                .insert(definition.name.clone(), contract.clone());
            contracts.ordered.push(contract);
        }
        Ok(contracts)
    }

    pub fn get(&self, name: &str) -> Option<Arc<TaskContract>> {
        self.by_name.get(name).cloned()
    }

    /// Every contract, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<TaskContract>> {
        self.ordered.iter()
    }

    pub fn names(&self) -> Vec<String> {
        self.ordered.iter().map(|c| c.name().to_owned()).collect()
    }

    /// The first task (the submit form's default).
    pub fn first(&self) -> Option<&Arc<TaskContract>> {
        self.ordered.first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task(template: Option<&str>, output_schema: Option<Value>) -> TaskContract {
        TaskContract::compile(&TaskDefinition {
            name: "t".into(),
            kind: TaskKind::Prompt,
            providers: vec!["p".into()],
            input_fields: vec![],
            template: template.map(str::to_owned),
            input_schema: None,
            output_schema,
            temperature: 0.0,
            golden: vec![],
            on_rate_limit: OnRateLimit::default(),
            max_attempts: default_max_attempts(),
            max_retry_wait_seconds: default_max_retry_wait_seconds(),
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
        let mut config = TaskDefinition {
            name: "t".into(),
            kind: TaskKind::Prompt,
            providers: vec![],
            input_fields: vec![],
            template: Some("{{ unclosed".into()),
            input_schema: None,
            output_schema: None,
            temperature: 0.0,
            golden: vec![],
            on_rate_limit: OnRateLimit::default(),
            max_attempts: default_max_attempts(),
            max_retry_wait_seconds: default_max_retry_wait_seconds(),
        };
        assert_eq!(config.check().unwrap_err().0, "template");
        config.template = None;
        config.output_schema = Some(json!({"type": 12}));
        assert_eq!(config.check().unwrap_err().0, "output_schema");
    }

    #[test]
    fn judging_turns_an_answer_outside_the_schema_into_invalid_output() {
        let schema = json!({"type": "object", "required": ["summary"]});
        let t = task(None, Some(schema));
        assert_eq!(
            t.judge(Outcome::Succeeded(json!({"summary": "ok"}))),
            Outcome::Succeeded(json!({"summary": "ok"}))
        );
        match t.judge(Outcome::Succeeded(json!({"other": 1}))) {
            Outcome::Failed(reason) => assert!(
                reason.to_string().starts_with("invalid_output: "),
                "{reason}"
            ),
            other => panic!("expected a failure, got {other:?}"),
        }
        assert_eq!(
            t.judge(Outcome::Unknown("timeout".into())),
            Outcome::Unknown("timeout".into())
        );
    }
}
