//! A small CloudFormation evaluator for the template-against-code checks of
//! `infra/template.yaml` (the `infra` tests): reading the template, following
//! intrinsics (`!Ref`, `!GetAtt`, `!Sub`), resolving parameters to their defaults, and
//! rendering the template as CloudFormation deploys it for given parameter values
//! (conditions evaluated, `Fn::If` resolved, `AWS::NoValue` dropped).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

pub fn template_text() -> String {
    let path = repo_root().join("infra/template.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn parse(text: &str) -> Value {
    serde_yaml::from_str(text).expect("infra/template.yaml is YAML")
}

pub fn template() -> Value {
    parse(&template_text())
}

pub fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping().and_then(|m| m.get(Value::from(key)))
}

pub fn path<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().try_fold(v, |v, k| get(v, k))
}

pub fn resources(t: &Value) -> &Mapping {
    get(t, "Resources")
        .and_then(Value::as_mapping)
        .expect("template has Resources")
}

pub fn resource<'a>(t: &'a Value, name: &str) -> &'a Value {
    get(get(t, "Resources").unwrap(), name).unwrap_or_else(|| panic!("no resource {name}"))
}

pub fn resources_of<'a>(t: &'a Value, kind: &str) -> Vec<(String, &'a Value)> {
    resources(t)
        .iter()
        .filter(|(_, r)| get(r, "Type").and_then(Value::as_str) == Some(kind))
        .map(|(k, r)| (k.as_str().unwrap().to_string(), r))
        .collect()
}

pub fn props(r: &Value) -> &Value {
    get(r, "Properties").expect("resource has Properties")
}

pub fn resource_type<'a>(t: &'a Value, name: &str) -> Option<&'a str> {
    get(get(t, "Resources")?, name)
        .and_then(|r| get(r, "Type"))
        .and_then(Value::as_str)
}

/// An intrinsic function in short (`!Ref X`) or long (`{Ref: X}`) form, normalized to
/// its long name (`Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If`, ...) and its argument.
pub fn intrinsic(v: &Value) -> Option<(String, &Value)> {
    match v {
        Value::Tagged(t) => {
            let tag = t.tag.to_string();
            let name = tag.trim_start_matches('!');
            let long = if name == "Ref" || name == "Condition" {
                name.to_string()
            } else {
                format!("Fn::{name}")
            };
            Some((long, &t.value))
        }
        Value::Mapping(m) if m.len() == 1 => {
            let (k, v) = m.iter().next()?;
            let k = k.as_str()?;
            (k == "Ref" || k.starts_with("Fn::")).then(|| (k.to_string(), v))
        }
        _ => None,
    }
}

/// `!Ref X` → `X`.
pub fn ref_target(v: &Value) -> Option<&str> {
    match intrinsic(v)? {
        (f, arg) if f == "Ref" => arg.as_str(),
        _ => None,
    }
}

/// `!GetAtt X.Attr` (or the list form) → `(X, Attr)`.
pub fn getatt(v: &Value) -> Option<(String, String)> {
    match intrinsic(v)? {
        (f, Value::String(s)) if f == "Fn::GetAtt" => {
            let (r, a) = s.split_once('.')?;
            Some((r.to_string(), a.to_string()))
        }
        (f, Value::Sequence(s)) if f == "Fn::GetAtt" && s.len() == 2 => {
            Some((s[0].as_str()?.to_string(), s[1].as_str()?.to_string()))
        }
        _ => None,
    }
}

/// A scalar as text, or a `!Ref` to a parameter as its default. `None` for anything
/// else (an attribute only known at deploy time).
pub fn resolve(t: &Value, v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => {
            let name = ref_target(v)?;
            let default = path(t, &["Parameters", name, "Default"])?;
            match default {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            }
        }
    }
}

pub fn resolve_number(t: &Value, v: &Value) -> Option<f64> {
    resolve(t, v)?.trim().parse().ok()
}

// ------------------------------------------------------------------ conditions

/// A condition's operand: a literal, a parameter's value, or `!Join [delimiter, !Ref
/// List]` of a `CommaDelimitedList` parameter (its items joined with the delimiter).
fn condition_operand(params: &BTreeMap<String, String>, v: &Value) -> String {
    if let Some(name) = ref_target(v) {
        return params
            .get(name)
            .unwrap_or_else(|| panic!("condition refers to {name}, not a parameter with a default"))
            .clone();
    }
    if let Some((f, Value::Sequence(args))) = intrinsic(v) {
        if f == "Fn::Join" && args.len() == 2 {
            let delimiter = args[0].as_str().expect("Fn::Join delimiter");
            let list = condition_operand(params, &args[1]);
            return list.split(',').collect::<Vec<_>>().join(delimiter);
        }
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("condition operand {other:?}"),
    }
}

/// Evaluates a condition expression (`Fn::Equals`, `Fn::Not`, `Fn::And`, `Fn::Or`,
/// `Condition`) for these parameter values.
fn evaluate(t: &Value, params: &BTreeMap<String, String>, v: &Value) -> bool {
    let (f, arg) = intrinsic(v).unwrap_or_else(|| panic!("condition {v:?}"));
    let args = || arg.as_sequence().cloned().unwrap_or_default();
    match f.as_str() {
        "Fn::Equals" => {
            let args = args();
            assert_eq!(args.len(), 2, "Fn::Equals {args:?}");
            condition_operand(params, &args[0]) == condition_operand(params, &args[1])
        }
        "Fn::Not" => !evaluate(t, params, &args()[0]),
        "Fn::And" => args().iter().all(|c| evaluate(t, params, c)),
        "Fn::Or" => args().iter().any(|c| evaluate(t, params, c)),
        "Condition" => named_condition(t, params, arg.as_str().unwrap()),
        other => panic!("{other} in a condition"),
    }
}

fn named_condition(t: &Value, params: &BTreeMap<String, String>, name: &str) -> bool {
    let expr = path(t, &["Conditions", name]).unwrap_or_else(|| panic!("no condition {name}"));
    evaluate(t, params, expr)
}

/// Every `Fn::If` replaced by the branch its condition picks; `None` for
/// `AWS::NoValue` (the key or list item is dropped, as CloudFormation does).
fn choose_branches(t: &Value, params: &BTreeMap<String, String>, v: &Value) -> Option<Value> {
    match intrinsic(v) {
        Some((f, Value::Sequence(args))) if f == "Fn::If" => {
            assert_eq!(args.len(), 3, "Fn::If {args:?}");
            let condition = args[0].as_str().expect("Fn::If names a condition");
            let branch = if named_condition(t, params, condition) {
                &args[1]
            } else {
                &args[2]
            };
            return choose_branches(t, params, branch);
        }
        Some((f, Value::String(s))) if f == "Ref" && s == "AWS::NoValue" => return None,
        _ => {}
    }
    Some(match v {
        Value::Mapping(m) => Value::Mapping(
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), choose_branches(t, params, v)?)))
                .collect(),
        ),
        Value::Sequence(s) => Value::Sequence(
            s.iter()
                .filter_map(|v| choose_branches(t, params, v))
                .collect(),
        ),
        Value::Tagged(tagged) => {
            let mut tagged = tagged.clone();
            tagged.value = choose_branches(t, params, &tagged.value)?;
            Value::Tagged(tagged)
        }
        other => other.clone(),
    })
}

/// The template as CloudFormation deploys it with these parameter values (the others
/// at their defaults): resources and outputs whose condition is false removed, every
/// `Fn::If` resolved, `AWS::NoValue` dropped, and the values written as the
/// parameters' defaults so that [`resolve`] sees them.
pub fn render(t: &Value, overrides: &[(&str, &str)]) -> Value {
    let mut params = BTreeMap::new();
    for (name, p) in get(t, "Parameters")
        .and_then(Value::as_mapping)
        .expect("Parameters")
    {
        if let Some(default) = get(p, "Default") {
            params.insert(
                name.as_str().unwrap().to_string(),
                condition_operand(&params, default),
            );
        }
    }
    for (name, value) in overrides {
        assert!(
            path(t, &["Parameters", name]).is_some(),
            "no parameter {name}"
        );
        params.insert(name.to_string(), value.to_string());
    }
    let mut out = t.clone();
    let root = out.as_mapping_mut().unwrap();
    for section in ["Resources", "Outputs"] {
        let Some(Value::Mapping(entries)) = root.get_mut(section) else {
            continue;
        };
        entries.retain(
            |_, entry| match get(entry, "Condition").and_then(Value::as_str) {
                Some(condition) => named_condition(t, &params, condition),
                None => true,
            },
        );
        for entry in entries.values_mut() {
            *entry = choose_branches(t, &params, entry).expect("an entry");
        }
    }
    if let Some(Value::Mapping(parameters)) = root.get_mut("Parameters") {
        for (name, p) in parameters.iter_mut() {
            if let (Some(value), Some(p)) = (params.get(name.as_str().unwrap()), p.as_mapping_mut())
            {
                p.insert(Value::from("Default"), Value::from(value.as_str()));
            }
        }
    }
    out
}

/// `!Sub text` (or a literal) → the text.
pub fn sub_text(v: &Value) -> Option<String> {
    match intrinsic(v) {
        Some((f, Value::String(s))) if f == "Fn::Sub" => Some(s.clone()),
        Some(_) => None,
        None => v.as_str().map(str::to_string),
    }
}
