//! Checks of `infra/template.yaml` against the code, without AWS:
//!
//! - every alarm (metric-math entries included) and every dashboard metric refers to a
//!   metric the code emits (`einmal::telemetry::catalog`: namespace, name, exact
//!   dimension set) or one AWS emits (a small explicit table), and a typo fails;
//! - every `EINMAL_*` variable the template sets is one the code reads, and each
//!   function gets the ones it requires;
//! - least privilege: the receiver may do exactly what the ack path needs, no `*`;
//!   each AWS sink's call (`SINK_ACTIONS`) is granted to the processor and the sweeper
//!   (the functions that deliver) on exactly its destination parameter's ARNs, only
//!   when that parameter is set, and to no other function;
//! - the queue: visibility timeout >= 6x the processor timeout, `maxReceiveCount` ==
//!   the processor's `EINMAL_MAX_RECEIVE_COUNT`, partial batch responses;
//! - tables, functions and routes mirror what the code and the README expect.
//! - with the conditions resolved: `TableBillingMode=PROVISIONED` gives every table and
//!   index capacity and auto scaling on reads and writes; `ReceiverFunctionUrl=true`
//!   adds a public function URL that reaches the receiver and nothing else.
//!
//! `cfn-lint`, `sam validate --lint` and `sam build` run in `tests/run.sh`
//! (`infra/check.sh`): they need Python tools and cross-compilation, not cargo.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use einmal::adapters::aws::AUDIT_TABLE_ENV;
use einmal::adapters::aws::SINK_ACTIONS;
use einmal::adapters::aws::{
    CONFIG_ENV, CONFIG_PARAMETER_ENV, DLQ_URL_ENV, QUEUE_URL_ENV, TABLE_ENV,
};
use einmal::adapters::aws::{RELAY_INDEX_PROJECTION, STATE_KEY_SCHEMA, STATE_TABLE_ENV};
use einmal::pipeline::process::{LEASE_MS_ENV, MAX_RECEIVE_COUNT_ENV};
use einmal::telemetry::catalog;
// Every function gets the deployment (stack) name: the `Deployment` dimension.
use einmal::telemetry::emf::{DEPLOYMENT_ENV, SLI_THRESHOLD_ENV};
use einmal_tests::cfn::{
    get, getatt, intrinsic, parse, path, props, ref_target, render, repo_root, resolve,
    resolve_number, resource, resource_type, resources_of, sub_text, template, template_text,
};
use serde_yaml::Value;

/// Metrics AWS publishes that the template may use: namespace, name, dimension names.
const AWS_METRICS: &[(&str, &[&str], &[&str])] = &[
    (
        "AWS/SQS",
        &[
            "ApproximateNumberOfMessagesVisible",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateAgeOfOldestMessage",
            "NumberOfMessagesSent",
            "NumberOfMessagesReceived",
            "NumberOfMessagesDeleted",
        ],
        &["QueueName"],
    ),
    (
        "AWS/Lambda",
        &[
            "Errors",
            "Throttles",
            "Invocations",
            "Duration",
            "ConcurrentExecutions",
            "UrlRequestCount",
            "Url4xxCount",
            "Url5xxCount",
        ],
        &["FunctionName"],
    ),
    (
        "AWS/ApiGateway",
        &["5xx", "4xx", "Count", "Latency", "IntegrationLatency"],
        &["ApiId"],
    ),
];

/// What a dimension value must point at: `QueueName` a queue's `QueueName`,
/// `FunctionName` a function, `ApiId` the HTTP API, `Deployment` the stack name.
fn expected_dimension_target(dimension: &str) -> Option<&'static str> {
    match dimension {
        "QueueName" => Some("AWS::SQS::Queue"),
        "FunctionName" => Some("AWS::Serverless::Function"),
        "ApiId" => Some("AWS::Serverless::HttpApi"),
        _ => None,
    }
}

// ------------------------------------------------------------------- metric references

/// One metric a template alarm or dashboard refers to.
#[derive(Debug)]
struct MetricRef {
    origin: String,
    namespace: String,
    name: String,
    /// Dimension name → what its value is (`Ref:X`, `GetAtt:X.Attr`, or the literal).
    dimensions: BTreeMap<String, String>,
    unit: Option<String>,
    /// A Metrics Insights alarm's `GROUP BY` dimension: one contributor per value
    /// (the per-destination alarms), so it may query that breakdown set.
    grouped_by: Option<String>,
}

fn describe_value(v: &Value) -> String {
    if let Some(r) = ref_target(v) {
        return format!("Ref:{r}");
    }
    if let Some((r, a)) = getatt(v) {
        return format!("GetAtt:{r}.{a}");
    }
    match v {
        Value::String(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn alarm_metric(origin: &str, m: &Value, unit: Option<&Value>) -> Result<MetricRef, String> {
    let text = |key: &str| {
        get(m, key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{origin}: no literal {key}"))
    };
    let mut dimensions = BTreeMap::new();
    for d in get(m, "Dimensions")
        .and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let name = get(d, "Name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{origin}: a dimension without a literal Name"))?;
        let value =
            get(d, "Value").ok_or_else(|| format!("{origin}: dimension {name} without a Value"))?;
        if dimensions
            .insert(name.to_string(), describe_value(value))
            .is_some()
        {
            return Err(format!("{origin}: dimension {name} twice"));
        }
    }
    Ok(MetricRef {
        origin: origin.to_string(),
        namespace: text("Namespace")?,
        name: text("MetricName")?,
        dimensions,
        unit: unit.and_then(Value::as_str).map(str::to_owned),
        grouped_by: None,
    })
}

/// The metric a Metrics Insights alarm queries:
/// `SELECT FN(Metric) FROM SCHEMA("Namespace", Dim, …) WHERE Deployment = '…'
/// [GROUP BY Dim]`. Every schema dimension is in the reference; `Deployment`'s value
/// is what the WHERE clause pins (`${AWS::StackName}` = `Ref:AWS::StackName`).
fn insights_metric(origin: &str, query: &str) -> Result<MetricRef, String> {
    let words: Vec<&str> = query.split_whitespace().collect();
    let text = words.join(" ");
    let between = |from: &str, to: &str| -> Result<String, String> {
        let start = text
            .find(from)
            .ok_or_else(|| format!("{origin}: query without {from:?}: {text}"))?
            + from.len();
        let end = text[start..]
            .find(to)
            .ok_or_else(|| format!("{origin}: query without {to:?} after {from:?}"))?;
        Ok(text[start..start + end].trim().to_string())
    };
    if !text.starts_with("SELECT ") {
        return Err(format!("{origin}: not a Metrics Insights query: {text}"));
    }
    let metric = between("(", ")")?;
    let schema = between("FROM SCHEMA(", ")")?;
    let mut parts = schema
        .split(',')
        .map(|p| p.trim().trim_matches('"').to_string());
    let namespace = parts.next().unwrap_or_default();
    let deployment = between("WHERE Deployment = '", "'")?;
    let deployment = match deployment.as_str() {
        "${AWS::StackName}" => "Ref:AWS::StackName".to_string(),
        other => other.to_string(),
    };
    let mut dimensions = BTreeMap::new();
    for dimension in parts {
        let value = match dimension.as_str() {
            d if d == catalog::DEPLOYMENT => deployment.clone(),
            _ => "*".to_string(),
        };
        dimensions.insert(dimension, value);
    }
    let grouped_by = text
        .split_once(" GROUP BY ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(str::to_string);
    Ok(MetricRef {
        origin: origin.to_string(),
        namespace,
        name: metric,
        dimensions,
        unit: None,
        grouped_by,
    })
}

/// Every metric every alarm uses; metric-math alarms contribute each `MetricStat`.
fn alarm_metrics(t: &Value) -> Result<Vec<MetricRef>, String> {
    let mut out = Vec::new();
    let alarms = resources_of(t, "AWS::CloudWatch::Alarm");
    if alarms.is_empty() {
        return Err("the template has no alarms".into());
    }
    for (name, alarm) in alarms {
        let p = props(alarm);
        if get(p, "AlarmActions").is_none() {
            return Err(format!("alarm {name} notifies nobody (no AlarmActions)"));
        }
        match (get(p, "MetricName"), get(p, "Metrics")) {
            (Some(_), None) => out.push(alarm_metric(&name, p, get(p, "Unit"))?),
            (None, Some(Value::Sequence(entries))) => {
                let mut ids = BTreeSet::new();
                let mut expressions = Vec::new();
                // A Metrics Insights query is a whole alarm's data on its own.
                let mut insights = false;
                for entry in entries {
                    let id = get(entry, "Id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("alarm {name}: a Metrics entry without Id"))?;
                    ids.insert(id.to_string());
                    let query = get(entry, "Expression").and_then(|e| match intrinsic(e) {
                        Some((f, Value::String(s))) if f == "Fn::Sub" => Some(s.clone()),
                        _ => e.as_str().map(str::to_owned),
                    });
                    if let Some(q) = query.filter(|q| q.trim_start().starts_with("SELECT")) {
                        out.push(insights_metric(&format!("{name}/{id}"), &q)?);
                        insights = true;
                        continue;
                    }
                    match (get(entry, "MetricStat"), get(entry, "Expression")) {
                        (Some(stat), None) => {
                            let metric = get(stat, "Metric").ok_or_else(|| {
                                format!("alarm {name}/{id}: MetricStat without Metric")
                            })?;
                            out.push(alarm_metric(
                                &format!("{name}/{id}"),
                                metric,
                                get(stat, "Unit"),
                            )?);
                        }
                        (None, Some(expr)) => {
                            let text = match intrinsic(expr) {
                                Some((f, Value::String(s))) if f == "Fn::Sub" => s.clone(),
                                _ => expr
                                    .as_str()
                                    .ok_or_else(|| {
                                        format!("alarm {name}/{id}: Expression is not text")
                                    })?
                                    .to_string(),
                            };
                            expressions.push((id.to_string(), text));
                        }
                        _ => {
                            return Err(format!(
                                "alarm {name}/{id}: needs MetricStat or Expression"
                            ))
                        }
                    }
                }
                if expressions.is_empty() && !insights {
                    return Err(format!("alarm {name}: Metrics without an expression"));
                }
                // Every lower-case identifier in an expression names a metric entry.
                for (id, text) in expressions {
                    let text = strip_subs(&text);
                    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                        let is_id = word.chars().next().is_some_and(|c| c.is_ascii_lowercase());
                        if is_id && !ids.contains(word) {
                            return Err(format!(
                                "alarm {name}/{id}: expression uses `{word}`, which is no metric id"
                            ));
                        }
                    }
                }
            }
            _ => {
                return Err(format!(
                    "alarm {name}: needs MetricName or Metrics (not both)"
                ))
            }
        }
    }
    Ok(out)
}

/// `${...}` substitutions removed (they are parameters, not metric ids).
fn strip_subs(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        match rest[start..].find('}') {
            Some(end) => {
                out.push('0');
                rest = &rest[start + end + 1..];
            }
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The dashboard body with `${X}` inside strings replaced by `Ref:X` / `GetAtt:X.A` /
/// the pseudo parameter, and bare `${Param}` numbers by their defaults.
fn dashboard_json(t: &Value) -> Result<serde_json::Value, String> {
    let dashboards = resources_of(t, "AWS::CloudWatch::Dashboard");
    let [(_, dashboard)] = dashboards.as_slice() else {
        return Err(format!(
            "expected one dashboard, found {}",
            dashboards.len()
        ));
    };
    let body = get(props(dashboard), "DashboardBody").ok_or("dashboard without a body")?;
    let text = match intrinsic(body) {
        Some((f, Value::String(s))) if f == "Fn::Sub" => s.clone(),
        _ => body
            .as_str()
            .ok_or("DashboardBody is not text")?
            .to_string(),
    };
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("${") {
        let quoted = rest[..start].ends_with('"') || out.ends_with('"') && start == 0;
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .ok_or("unclosed ${ in the dashboard")?
            + start;
        let inner = &rest[start + 2..end];
        let replacement = if inner.starts_with("AWS::") {
            inner.to_string()
        } else if let Some((r, a)) = inner.split_once('.') {
            format!("GetAtt:{r}.{a}")
        } else if quoted {
            format!("Ref:{inner}")
        } else {
            resolve(
                t,
                &Value::Tagged(Box::new(serde_yaml::value::TaggedValue {
                    tag: serde_yaml::value::Tag::new("Ref"),
                    value: Value::from(inner),
                })),
            )
            .ok_or_else(|| format!("dashboard: ${{{inner}}} has no default"))?
        };
        out.push_str(&replacement);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    serde_json::from_str(&out).map_err(|e| format!("dashboard body is not JSON: {e}"))
}

fn dashboard_metrics(t: &Value) -> Result<Vec<MetricRef>, String> {
    let body = dashboard_json(t)?;
    let widgets = body["widgets"]
        .as_array()
        .ok_or("dashboard without widgets")?;
    let mut out = Vec::new();
    for (i, w) in widgets.iter().enumerate() {
        if w["type"] != "metric" {
            continue;
        }
        let title = w["properties"]["title"].as_str().unwrap_or("?");
        let metrics = w["properties"]["metrics"]
            .as_array()
            .ok_or_else(|| format!("widget {i} ({title}) has no metrics"))?;
        for m in metrics {
            let parts = m.as_array().ok_or("a dashboard metric is not an array")?;
            let texts: Vec<&str> = parts.iter().filter_map(|p| p.as_str()).collect();
            let origin = format!("dashboard widget {title:?}");
            let unpaired = texts
                .get(2..)
                .is_some_and(|d| !d.chunks_exact(2).remainder().is_empty());
            if texts.len() < 2 || unpaired || texts.contains(&".") {
                return Err(format!("{origin}: write every metric out in full: {m}"));
            }
            let mut dimensions = BTreeMap::new();
            for pair in texts[2..].chunks(2) {
                dimensions.insert(pair[0].to_string(), pair[1].to_string());
            }
            out.push(MetricRef {
                origin,
                namespace: texts[0].to_string(),
                name: texts[1].to_string(),
                dimensions,
                unit: None,
                grouped_by: None,
            });
        }
    }
    Ok(out)
}

/// Why `m` is not a metric the code or AWS emits, if it is not.
fn check_metric(t: &Value, m: &MetricRef, alarm: bool) -> Result<(), String> {
    let origin = &m.origin;
    let dims: BTreeSet<&str> = m.dimensions.keys().map(String::as_str).collect();
    if m.namespace == catalog::NAMESPACE {
        let spec = catalog::find(&m.name).ok_or_else(|| {
            format!(
                "{origin}: {}/{} is not in the metric catalog",
                m.namespace, m.name
            )
        })?;
        let known = spec
            .dimension_sets
            .iter()
            .any(|set| set.iter().copied().collect::<BTreeSet<_>>() == dims);
        if !known {
            return Err(format!(
                "{origin}: {} is emitted with dimensions {:?}, not {dims:?}",
                m.name, spec.dimension_sets
            ));
        }
        // Alarms use the deployment-only set, except a Metrics Insights alarm grouped
        // by the one breakdown dimension (a contributor per destination).
        let grouped = m
            .grouped_by
            .as_deref()
            .is_some_and(|g| dims == BTreeSet::from([catalog::DEPLOYMENT, g]));
        if alarm && dims != BTreeSet::from([catalog::DEPLOYMENT]) && !grouped {
            return Err(format!(
                "{origin}: alarms use the deployment-only dimension set, not {dims:?}"
            ));
        }
        let deployment = &m.dimensions[catalog::DEPLOYMENT];
        if deployment != "Ref:AWS::StackName" && deployment != "AWS::StackName" {
            return Err(format!(
                "{origin}: the {} dimension is the stack name (EINMAL_DEPLOYMENT), not {deployment}",
                catalog::DEPLOYMENT
            ));
        }
        if let Some(unit) = &m.unit {
            if unit != spec.unit.as_str() {
                return Err(format!(
                    "{origin}: {} is published in {:?}, not {unit}",
                    m.name, spec.unit
                ));
            }
        }
        return Ok(());
    }
    let (_, names, expected) = AWS_METRICS
        .iter()
        .find(|(ns, _, _)| *ns == m.namespace)
        .ok_or_else(|| {
            format!(
                "{origin}: namespace {} is neither ours nor a known AWS one",
                m.namespace
            )
        })?;
    if !names.contains(&m.name.as_str()) {
        return Err(format!(
            "{origin}: {}/{} is not a metric AWS emits",
            m.namespace, m.name
        ));
    }
    if dims != expected.iter().copied().collect::<BTreeSet<_>>() {
        return Err(format!(
            "{origin}: {}/{} has dimensions {expected:?}, not {dims:?}",
            m.namespace, m.name
        ));
    }
    for (dimension, value) in &m.dimensions {
        let Some(kind) = expected_dimension_target(dimension) else {
            continue;
        };
        let target = value
            .strip_prefix("Ref:")
            .or_else(|| value.strip_prefix("GetAtt:"))
            .ok_or_else(|| {
                format!("{origin}: {dimension} must refer to a resource, not {value:?}")
            })?;
        let (resource, attribute) = match target.split_once('.') {
            Some((r, a)) => (r, Some(a)),
            None => (target, None),
        };
        let actual = resource_type(t, resource);
        if actual != Some(kind) {
            return Err(format!(
                "{origin}: {dimension} refers to {resource} ({actual:?}), not a {kind}"
            ));
        }
        if dimension == "QueueName" && attribute != Some("QueueName") {
            return Err(format!(
                "{origin}: QueueName must be !GetAtt {resource}.QueueName"
            ));
        }
    }
    Ok(())
}

fn metric_problems(t: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    match alarm_metrics(t) {
        Ok(metrics) => problems.extend(
            metrics
                .iter()
                .filter_map(|m| check_metric(t, m, true).err()),
        ),
        Err(e) => problems.push(e),
    }
    match dashboard_metrics(t) {
        Ok(metrics) => problems.extend(
            metrics
                .iter()
                .filter_map(|m| check_metric(t, m, false).err()),
        ),
        Err(e) => problems.push(e),
    }
    problems
}

#[test]
fn every_alarm_and_dashboard_metric_is_one_the_code_or_aws_emits() {
    let t = template();
    let problems = metric_problems(&t);
    assert!(problems.is_empty(), "{problems:#?}");
    // The alarms the runbook relies on are there.
    let metrics = alarm_metrics(&t).unwrap();
    let used: BTreeSet<(&str, &str)> = metrics
        .iter()
        .map(|m| (m.namespace.as_str(), m.name.as_str()))
        .collect();
    for wanted in [
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible"),
        ("AWS/SQS", "ApproximateAgeOfOldestMessage"),
        ("AWS/ApiGateway", "5xx"),
        ("AWS/Lambda", "Errors"),
        ("AWS/Lambda", "Throttles"),
        (catalog::NAMESPACE, catalog::STUCK_ITEMS),
        (catalog::NAMESPACE, catalog::OLDEST_WAITING_AGE),
        (catalog::NAMESPACE, catalog::DELIVERY_BACKLOG_AGE),
        (catalog::NAMESPACE, catalog::DELIVERY_DEAD_LETTERS),
        (catalog::NAMESPACE, catalog::SIGNATURE_FAILURES),
        (catalog::NAMESPACE, catalog::WEBHOOKS_ACCEPTED),
        (catalog::NAMESPACE, catalog::WEBHOOKS_DUPLICATE),
        (catalog::NAMESPACE, catalog::PAYMENT_WITHIN_SLO),
    ] {
        assert!(used.contains(&wanted), "no alarm on {wanted:?}");
    }
    // The delivery alarms are per destination: a contributor per Destination.
    for metric in [
        catalog::DELIVERY_DEAD_LETTERS,
        catalog::DELIVERY_BACKLOG_AGE,
    ] {
        let per_destination = metrics
            .iter()
            .any(|m| m.name == metric && m.grouped_by.as_deref() == Some(catalog::DESTINATION));
        assert!(per_destination, "no per-destination alarm on {metric}");
    }
    // Errors and throttles of every function.
    for (function, _) in resources_of(&t, "AWS::Serverless::Function") {
        for metric in ["Errors", "Throttles"] {
            let found = metrics.iter().any(|m| {
                m.namespace == "AWS/Lambda"
                    && m.name == metric
                    && m.dimensions.get("FunctionName") == Some(&format!("Ref:{function}"))
            });
            assert!(found, "no {metric} alarm for {function}");
        }
    }
    // The dashboard has the four groups.
    let body = dashboard_json(&t).unwrap();
    let headers: Vec<String> = body["widgets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["type"] == "text")
        .map(|w| {
            w["properties"]["markdown"]
                .as_str()
                .unwrap_or("")
                .to_lowercase()
        })
        .collect();
    for group in ["intake", "queue", "worker", "business"] {
        assert!(
            headers.iter().any(|h| h.contains(group)),
            "dashboard has no {group} group: {headers:?}"
        );
    }
}

#[test]
fn a_typo_in_an_alarm_or_dashboard_metric_fails_the_check() {
    let text = template_text();
    let mutations: &[(&str, &str, &str, &str)] = &[
        ("custom metric name", "MetricName: StuckItems", "MetricName: StuckItem", "StuckItem is not in the metric catalog"),
        ("namespace", "Namespace: Einmal\n", "Namespace: einmal\n", "namespace einmal is neither ours"),
        ("AWS metric name", "MetricName: ApproximateAgeOfOldestMessage", "MetricName: ApproximateAgeOfOldestMessages", "is not a metric AWS emits"),
        ("AWS dimension name", "- Name: QueueName", "- Name: Queue", "has dimensions [\"QueueName\"]"),
        ("metric-math metric", "MetricName: WebhooksDuplicate\n", "MetricName: WebhooksDuplicates\n", "WebhooksDuplicates is not in the metric catalog"),
        ("metric-math id", "FILL(duplicates, 0) / (", "FILL(duplicate, 0) / (", "which is no metric id"),
        ("breakdown dimension on an alarm", "MetricName: SignatureFailures\n      Dimensions:\n", "MetricName: SignatureFailures\n      Dimensions:\n        - Name: Provider\n          Value: stripe\n", "deployment-only dimension set"),
        ("deployment value", "- Name: Deployment\n          Value: !Ref AWS::StackName", "- Name: Deployment\n          Value: einmal", "is the stack name"),
        ("dimension pointing at the wrong resource", "Value: !Ref ProcessorFunction", "Value: !Ref WorkQueue", "refers to WorkQueue"),
        ("Metrics Insights metric", "MAX(DeliveryDeadLetters)", "MAX(DeliveryDeadLetter)", "DeliveryDeadLetter is not in the metric catalog"),
        ("Metrics Insights grouping", "WHERE Deployment = '${AWS::StackName}' GROUP BY Destination", "WHERE Deployment = '${AWS::StackName}' GROUP BY Provider", "deployment-only dimension set"),
        ("Metrics Insights deployment", "WHERE Deployment = '${AWS::StackName}'", "WHERE Deployment = 'einmal'", "is the stack name"),
        ("dashboard metric", "\"EffectLag\"", "\"EffectLagg\"", "EffectLagg is not in the metric catalog"),
        ("dashboard dimension", "\"Deployment\", \"${AWS::StackName}\", {\"label\": \"completed\"}", "\"Stack\", \"${AWS::StackName}\", {\"label\": \"completed\"}", "not {\"Stack\"}"),
    ];
    for (what, from, to, expected) in mutations {
        assert!(
            text.contains(from),
            "mutation {what}: {from:?} is not in the template"
        );
        let broken = parse(&text.replacen(from, to, 1));
        let problems = metric_problems(&broken);
        assert!(
            problems.iter().any(|p| p.contains(expected)),
            "a typo in the {what} went unnoticed: {problems:?}"
        );
    }
}

// ------------------------------------------------------------------ environment

/// Every `"EINMAL_*"` string literal in the code that runs in the functions and the CLI.
fn variables_the_code_reads() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                for (i, _) in text.match_indices("\"EINMAL_") {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if text[i + 1 + name.len()..].starts_with('"') {
                        out.insert(name);
                    }
                }
            }
        }
    }
    let root = repo_root();
    let mut out = BTreeSet::new();
    for dir in ["shared/src", "functions", "cli/src"] {
        walk(&root.join(dir), &mut out);
    }
    out
}

/// The environment of a function: `Globals.Function` merged with its own.
fn environment(t: &Value, function: &str) -> BTreeMap<String, Value> {
    let mut env = BTreeMap::new();
    for vars in [
        path(t, &["Globals", "Function", "Environment", "Variables"]),
        path(props(resource(t, function)), &["Environment", "Variables"]),
    ]
    .into_iter()
    .flatten()
    {
        for (k, v) in vars.as_mapping().expect("Variables is a mapping") {
            env.insert(k.as_str().unwrap().to_string(), v.clone());
        }
    }
    env
}

const FUNCTIONS: [&str; 4] = [
    "ReceiverFunction",
    "ProcessorFunction",
    "SweeperFunction",
    "ReconcilerFunction",
];

#[test]
fn every_einmal_variable_is_read_by_the_code_and_each_function_has_what_it_needs() {
    let t = template();
    let read = variables_the_code_reads();
    assert!(
        read.contains(TABLE_ENV),
        "the source scan found nothing: {read:?}"
    );
    assert!(
        read.contains(DEPLOYMENT_ENV),
        "the code does not read {DEPLOYMENT_ENV} (the Deployment dimension of every metric)"
    );
    let required: [(&str, &[&str]); 4] = [
        (
            "ReceiverFunction",
            &[TABLE_ENV, QUEUE_URL_ENV, CONFIG_PARAMETER_ENV],
        ),
        (
            "ProcessorFunction",
            &[
                TABLE_ENV,
                QUEUE_URL_ENV,
                DLQ_URL_ENV,
                STATE_TABLE_ENV,
                CONFIG_PARAMETER_ENV,
                MAX_RECEIVE_COUNT_ENV,
                LEASE_MS_ENV,
                SLI_THRESHOLD_ENV,
            ],
        ),
        (
            "SweeperFunction",
            &[TABLE_ENV, QUEUE_URL_ENV, DLQ_URL_ENV, CONFIG_PARAMETER_ENV],
        ),
        (
            "ReconcilerFunction",
            &[
                TABLE_ENV,
                QUEUE_URL_ENV,
                STATE_TABLE_ENV,
                AUDIT_TABLE_ENV,
                CONFIG_PARAMETER_ENV,
            ],
        ),
    ];
    for (function, needs) in required {
        let env = environment(&t, function);
        for name in env.keys().filter(|k| k.starts_with("EINMAL_")) {
            assert!(
                read.contains(name),
                "{function} sets {name}, which no code reads"
            );
        }
        for name in needs.iter().copied().chain([DEPLOYMENT_ENV]) {
            assert!(env.contains_key(name), "{function} lacks {name}");
        }
        // Secrets by reference: the SSM parameter's name, never the TOML inline.
        assert!(
            !env.contains_key(CONFIG_ENV),
            "{function} sets {CONFIG_ENV} inline"
        );
        if let Some(v) = env.get(CONFIG_PARAMETER_ENV) {
            let target = ref_target(v).unwrap_or("");
            assert_eq!(
                path(&t, &["Parameters", target, "Type"]).and_then(Value::as_str),
                Some("String"),
                "{function}: {CONFIG_PARAMETER_ENV} must be a template parameter"
            );
        }
        assert_eq!(
            env.get(DEPLOYMENT_ENV).and_then(ref_target),
            Some("AWS::StackName"),
            "{function}: {DEPLOYMENT_ENV} is the stack name"
        );
        let refs = |name: &str| env.get(name).and_then(ref_target).map(str::to_owned);
        if env.contains_key(TABLE_ENV) {
            assert_eq!(refs(TABLE_ENV).as_deref(), Some("InboxTable"), "{function}");
        }
        if env.contains_key(QUEUE_URL_ENV) {
            assert_eq!(
                refs(QUEUE_URL_ENV).as_deref(),
                Some("WorkQueue"),
                "{function}"
            );
        }
        if env.contains_key(DLQ_URL_ENV) {
            assert_eq!(
                refs(DLQ_URL_ENV).as_deref(),
                Some("DeadLetterQueue"),
                "{function}"
            );
        }
        if env.contains_key(STATE_TABLE_ENV) {
            assert_eq!(
                refs(STATE_TABLE_ENV).as_deref(),
                Some("StateTable"),
                "{function}"
            );
        }
        if env.contains_key(AUDIT_TABLE_ENV) {
            assert_eq!(
                refs(AUDIT_TABLE_ENV).as_deref(),
                Some("AuditTable"),
                "{function}"
            );
        }
    }
    // The lease outlives the processor's invocation.
    let env = environment(&t, "ProcessorFunction");
    let lease_ms = resolve_number(&t, &env[LEASE_MS_ENV]).unwrap();
    let timeout_s = function_timeout(&t, "ProcessorFunction");
    assert!(
        lease_ms > timeout_s * 1000.0,
        "lease {lease_ms} ms <= timeout {timeout_s} s"
    );
}

// ------------------------------------------------------------------ IAM

/// Inline policy statements of a function (both branches of an `!If`), and the
/// policies that are not inline documents (managed policy names, SAM policy templates).
fn statements(function: &Value) -> (Vec<Value>, Vec<String>) {
    let mut inline = Vec::new();
    let mut other = Vec::new();
    fn push(v: &Value, out: &mut Vec<Value>) {
        match intrinsic(v) {
            Some((f, Value::Sequence(args))) if f == "Fn::If" && args.len() == 3 => {
                push(&args[1], out);
                push(&args[2], out);
            }
            Some((f, Value::String(s))) if f == "Ref" && s == "AWS::NoValue" => {}
            _ => out.push(v.clone()),
        }
    }
    let policies = match get(props(function), "Policies") {
        None => Vec::new(),
        Some(Value::Sequence(s)) => s.clone(),
        Some(other) => vec![other.clone()],
    };
    for policy in policies {
        match get(&policy, "Statement") {
            Some(Value::Sequence(list)) => {
                for s in list {
                    push(s, &mut inline);
                }
            }
            _ => other.push(format!("{policy:?}")),
        }
    }
    (inline, other)
}

fn list(v: Option<&Value>) -> Vec<Value> {
    match v {
        None => Vec::new(),
        Some(Value::Sequence(s)) => s.clone(),
        Some(one) => vec![one.clone()],
    }
}

#[test]
fn functions_have_least_privilege_and_no_wildcard_actions() {
    let t = template();
    for (name, function) in resources_of(&t, "AWS::Serverless::Function") {
        let (inline, other) = statements(function);
        assert!(
            other.is_empty(),
            "{name} has policies other than inline statements: {other:?}"
        );
        assert!(!inline.is_empty(), "{name} has no policy");
        for s in &inline {
            assert_eq!(
                get(s, "Effect").and_then(Value::as_str),
                Some("Allow"),
                "{name}: {s:?}"
            );
            assert!(
                get(s, "NotAction").is_none() && get(s, "NotResource").is_none(),
                "{name}: {s:?}"
            );
            for action in list(get(s, "Action")) {
                let action = action
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: action {action:?}"));
                assert!(!action.contains('*'), "{name}: wildcard action {action}");
            }
            for r in list(get(s, "Resource")) {
                assert_ne!(r.as_str(), Some("*"), "{name}: wildcard resource in {s:?}");
            }
        }
    }

    // The receiver: exactly the ack path, on exactly its resources.
    let (inline, _) = statements(resource(&t, "ReceiverFunction"));
    let mut granted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in &inline {
        let resources: Vec<String> = list(get(s, "Resource"))
            .iter()
            .map(describe_value)
            .collect();
        for action in list(get(s, "Action")) {
            granted
                .entry(action.as_str().unwrap().to_string())
                .or_default()
                .extend(resources.iter().cloned());
        }
    }
    let actions: BTreeSet<&str> = granted.keys().map(String::as_str).collect();
    assert_eq!(
        actions,
        BTreeSet::from([
            "dynamodb:PutItem",
            "dynamodb:GetItem",
            "dynamodb:UpdateItem",
            "sqs:SendMessage",
            "ssm:GetParameter",
            // a configuration split across parameters below a path
            "ssm:GetParametersByPath",
            // the configuration's { ssm = "…" } secret references
            "ssm:GetParameters",
            // only when the SecureString uses a customer-managed key
            "kms:Decrypt",
        ]),
        "receiver actions"
    );
    for action in [
        "dynamodb:PutItem",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
    ] {
        assert_eq!(
            granted[action],
            BTreeSet::from(["GetAtt:InboxTable.Arn".to_string()]),
            "{action}"
        );
    }
    assert_eq!(
        granted["sqs:SendMessage"],
        BTreeSet::from(["GetAtt:WorkQueue.Arn".to_string()])
    );
    let ssm = &granted["ssm:GetParameter"];
    assert!(
        ssm.len() == 1
            && ssm
                .iter()
                .all(|r| r.contains("parameter${ConfigParameterName}")),
        "ssm:GetParameter only on the config parameter: {ssm:?}"
    );
    assert_eq!(
        &granted["ssm:GetParametersByPath"], ssm,
        "ssm:GetParametersByPath only on the config parameter's path"
    );
    assert_eq!(
        granted["kms:Decrypt"],
        BTreeSet::from(["Ref:ConfigKmsKeyArn".to_string()])
    );
    // Every function loads the configuration, so each may read the secret references,
    // below SecretParameterPath only.
    for (name, function) in resources_of(&t, "AWS::Serverless::Function") {
        let (inline, _) = statements(function);
        let resources: BTreeSet<String> = inline
            .iter()
            .filter(|s| {
                list(get(s, "Action"))
                    .iter()
                    .any(|a| a.as_str() == Some("ssm:GetParameters"))
            })
            .flat_map(|s| {
                list(get(s, "Resource"))
                    .iter()
                    .map(describe_value)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(
            resources.len() == 1
                && resources
                    .iter()
                    .all(|r| r.contains("parameter${SecretParameterPath}*")),
            "{name}: ssm:GetParameters only below SecretParameterPath: {resources:?}"
        );
    }
}

#[test]
fn only_the_delivering_functions_join_a_vpc_and_only_when_subnets_are_given() {
    let t = template();
    for (name, function) in resources_of(&t, "AWS::Serverless::Function") {
        let vpc = get(props(function), "VpcConfig");
        if !["ProcessorFunction", "SweeperFunction"].contains(&name.as_str()) {
            assert!(
                vpc.is_none(),
                "{name} must not join the VPC (intake stays outside)"
            );
            continue;
        }
        let vpc = vpc.unwrap_or_else(|| panic!("{name} has no VpcConfig"));
        let Some((f, Value::Sequence(args))) = intrinsic(vpc) else {
            panic!("{name}: VpcConfig is not conditional: {vpc:?}");
        };
        assert_eq!(f, "Fn::If", "{name}");
        assert_eq!(args[0].as_str(), Some("InVpc"), "{name}");
        assert_eq!(
            describe_value(get(&args[1], "SubnetIds").expect("SubnetIds")),
            "Ref:VpcSubnetIds"
        );
        assert_eq!(
            describe_value(get(&args[1], "SecurityGroupIds").expect("SecurityGroupIds")),
            "Ref:VpcSecurityGroupIds"
        );
        assert!(
            matches!(intrinsic(&args[2]), Some((f, Value::String(v))) if f == "Ref" && v == "AWS::NoValue"),
            "{name}: without subnets no VpcConfig"
        );
    }
    let condition = get(get(&t, "Conditions").expect("Conditions"), "InVpc").expect("InVpc");
    assert!(
        format!("{condition:?}").contains("VpcSubnetIds"),
        "InVpc is about VpcSubnetIds: {condition:?}"
    );
}

/// The template parameter that lists the ARNs of each AWS sink kind's destinations.
fn destination_parameter(kind: &str) -> &'static str {
    match kind {
        "sqs" => "DestinationQueueArns",
        "eventbridge" => "DestinationEventBusArns",
        "lambda" => "DestinationFunctionArns",
        other => panic!("AWS sink kind {other} has no destination parameter in this test"),
    }
}

/// Statements of `function` (rendered) that name a destination parameter: (action,
/// parameter) pairs.
fn destination_grants(t: &Value, function: &str) -> BTreeSet<(String, String)> {
    let (inline, _) = statements(resource(t, function));
    let mut grants = BTreeSet::new();
    for s in &inline {
        for r in list(get(s, "Resource")) {
            let Some(param) = ref_target(&r).filter(|p| p.starts_with("Destination")) else {
                continue;
            };
            for action in list(get(s, "Action")) {
                grants.insert((action.as_str().unwrap().to_string(), param.to_string()));
            }
        }
    }
    grants
}

#[test]
fn each_aws_sink_call_is_granted_on_its_destination_arns_only_when_set() {
    let t = template();
    let expected: BTreeSet<(String, String)> = SINK_ACTIONS
        .iter()
        .map(|(kind, action)| (action.to_string(), destination_parameter(kind).to_string()))
        .collect();
    for (_, param) in &expected {
        let p = path(&t, &["Parameters", param]).unwrap_or_else(|| panic!("no parameter {param}"));
        assert_eq!(
            get(p, "Type").and_then(Value::as_str),
            Some("CommaDelimitedList"),
            "{param}"
        );
        assert_eq!(
            get(p, "Default").and_then(Value::as_str),
            Some(""),
            "{param}"
        );
    }
    // Unset (the defaults): no destination statement anywhere.
    let unset = render(&t, &[]);
    for (name, _) in resources_of(&unset, "AWS::Serverless::Function") {
        let grants = destination_grants(&unset, &name);
        assert!(
            grants.is_empty(),
            "{name} has destination grants by default: {grants:?}"
        );
    }
    // Each set alone: exactly its call, to the processor and the sweeper.
    for (action, param) in &expected {
        let set = render(
            &t,
            &[(
                param,
                "arn:aws:sqs:eu-west-1:123456789012:a,arn:aws:sqs:eu-west-1:123456789012:b",
            )],
        );
        for (name, _) in resources_of(&set, "AWS::Serverless::Function") {
            let grants = destination_grants(&set, &name);
            let delivers = name == "ProcessorFunction" || name == "SweeperFunction";
            let want = if delivers {
                BTreeSet::from([(action.clone(), param.clone())])
            } else {
                BTreeSet::new()
            };
            assert_eq!(grants, want, "{name} with {param} set");
        }
    }
    // All set: all calls (a sink added to SINK_ACTIONS without a statement fails here).
    let all: Vec<(&str, &str)> = expected
        .iter()
        .map(|(_, p)| {
            (
                p.as_str(),
                "arn:aws:lambda:eu-west-1:123456789012:function:f",
            )
        })
        .collect();
    let set = render(&t, &all);
    for function in ["ProcessorFunction", "SweeperFunction"] {
        assert_eq!(destination_grants(&set, function), expected, "{function}");
    }
}

// ------------------------------------------------------------------ queue

fn function_timeout(t: &Value, function: &str) -> f64 {
    let own = get(props(resource(t, function)), "Timeout");
    let global = path(t, &["Globals", "Function", "Timeout"]);
    own.or(global)
        .and_then(|v| resolve_number(t, v))
        .unwrap_or(3.0)
}

#[test]
fn queue_redrive_matches_the_processor() {
    let t = template();
    let queue = props(resource(&t, "WorkQueue"));
    let visibility = resolve_number(
        &t,
        get(queue, "VisibilityTimeout").expect("VisibilityTimeout"),
    )
    .expect("a literal visibility timeout");
    let timeout = function_timeout(&t, "ProcessorFunction");
    assert!(
        visibility >= 6.0 * timeout,
        "visibility timeout {visibility} s < 6 x processor timeout {timeout} s"
    );

    let redrive = get(queue, "RedrivePolicy").expect("RedrivePolicy");
    assert_eq!(
        get(redrive, "deadLetterTargetArn").and_then(getatt),
        Some(("DeadLetterQueue".to_string(), "Arn".to_string()))
    );
    let max_receive = get(redrive, "maxReceiveCount").expect("maxReceiveCount");
    let env = environment(&t, "ProcessorFunction");
    let processor = &env[MAX_RECEIVE_COUNT_ENV];
    // Equal by construction (the same parameter) or as literals; a parameter on one
    // side and a literal on the other could drift at deploy time.
    match (ref_target(max_receive), ref_target(processor)) {
        (Some(a), Some(b)) => assert_eq!(a, b, "maxReceiveCount and {MAX_RECEIVE_COUNT_ENV}"),
        (None, None) => assert_eq!(
            resolve(&t, max_receive),
            resolve(&t, processor),
            "maxReceiveCount and {MAX_RECEIVE_COUNT_ENV}"
        ),
        _ => panic!("maxReceiveCount and {MAX_RECEIVE_COUNT_ENV} must both be literals or both the same parameter"),
    }
    let count = resolve_number(&t, max_receive).unwrap();
    assert!(count >= 2.0, "maxReceiveCount {count}");

    // The processor consumes this queue, reports partial failures, has a concurrency cap.
    let events = get(props(resource(&t, "ProcessorFunction")), "Events")
        .and_then(Value::as_mapping)
        .expect("processor events");
    let sqs: Vec<&Value> = events
        .values()
        .filter(|e| get(e, "Type").and_then(Value::as_str) == Some("SQS"))
        .map(props)
        .collect();
    let [event] = sqs.as_slice() else {
        panic!(
            "the processor needs exactly one SQS event, found {}",
            sqs.len()
        );
    };
    assert_eq!(
        get(event, "Queue").and_then(getatt),
        Some(("WorkQueue".to_string(), "Arn".to_string()))
    );
    assert!(
        list(get(event, "FunctionResponseTypes"))
            .iter()
            .any(|v| v.as_str() == Some("ReportBatchItemFailures")),
        "ReportBatchItemFailures"
    );
    assert!(
        path(event, &["ScalingConfig", "MaximumConcurrency"]).is_some(),
        "ScalingConfig.MaximumConcurrency"
    );
    // Visibility changes use the records' receipt handles: same queue.
    assert_eq!(
        env.get(QUEUE_URL_ENV).and_then(ref_target),
        Some("WorkQueue")
    );
}

// ------------------------------------------------------------------ tables, functions, routes

fn attribute_types(table: &Value) -> BTreeMap<String, String> {
    list(get(table, "AttributeDefinitions"))
        .iter()
        .map(|a| {
            (
                get(a, "AttributeName")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_string(),
                get(a, "AttributeType")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

fn key_schema(v: &Value) -> Vec<(String, String)> {
    list(get(v, "KeySchema"))
        .iter()
        .map(|k| {
            (
                get(k, "AttributeName")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_string(),
                get(k, "KeyType")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

fn index<'a>(table: &'a Value, name: &str) -> &'a Value {
    let indexes = get(table, "GlobalSecondaryIndexes").expect("GlobalSecondaryIndexes");
    indexes
        .as_sequence()
        .unwrap()
        .iter()
        .find(|i| get(i, "IndexName").and_then(Value::as_str) == Some(name))
        .unwrap_or_else(|| panic!("no index {name}"))
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[test]
fn tables_mirror_the_code_and_are_protected() {
    let t = template();
    for (name, table) in resources_of(&t, "AWS::DynamoDB::Table") {
        let p = props(table);
        // On-demand unless TableBillingMode says otherwise (see
        // `provisioned_mode_scales_every_table_and_index`).
        assert_eq!(
            get(p, "BillingMode")
                .and_then(|v| resolve(&t, v))
                .as_deref(),
            Some("PAY_PER_REQUEST"),
            "{name}"
        );
        assert_eq!(
            path(
                p,
                &[
                    "PointInTimeRecoverySpecification",
                    "PointInTimeRecoveryEnabled"
                ]
            )
            .and_then(Value::as_bool),
            Some(true),
            "{name}: point-in-time recovery"
        );
        assert_eq!(
            path(p, &["SSESpecification", "SSEEnabled"]).and_then(Value::as_bool),
            Some(true),
            "{name}: SSE"
        );
        assert_eq!(
            get(table, "DeletionPolicy").and_then(Value::as_str),
            Some("Retain"),
            "{name}"
        );
    }

    // Inbox: as `create_tables` in shared/src/adapters/aws/setup.rs.
    let inbox = props(resource(&t, "InboxTable"));
    assert_eq!(key_schema(inbox), vec![pair("pk", "HASH")]);
    let types = attribute_types(inbox);
    assert_eq!(types.get("pk").map(String::as_str), Some("S"));
    assert_eq!(types.get("sweep_shard").map(String::as_str), Some("S"));
    assert_eq!(types.get("received_at_ms").map(String::as_str), Some("N"));
    let pending = index(inbox, "by_sweep_shard");
    assert_eq!(
        key_schema(pending),
        vec![pair("sweep_shard", "HASH"), pair("received_at_ms", "RANGE")]
    );
    // Keys only: the sweeper reads its candidates from the table (BatchGetItem).
    assert_eq!(
        path(pending, &["Projection", "ProjectionType"]).and_then(Value::as_str),
        Some("KEYS_ONLY")
    );
    // The waiters' index, as `wait_index` in setup.rs: by prerequisite record, with
    // the attributes the wake and the sweeper read projected.
    assert_eq!(types.get("wait_shard").map(String::as_str), Some("S"));
    assert_eq!(types.get("wait_on").map(String::as_str), Some("S"));
    let waiters = index(inbox, "by_wait_shard");
    assert_eq!(
        key_schema(waiters),
        vec![pair("wait_shard", "HASH"), pair("wait_on", "RANGE")]
    );
    assert_eq!(
        path(waiters, &["Projection", "ProjectionType"]).and_then(Value::as_str),
        Some("INCLUDE")
    );
    let projected: BTreeSet<String> = list(path(waiters, &["Projection", "NonKeyAttributes"]))
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    assert_eq!(
        projected,
        BTreeSet::from(["state", "updated_at_ms", "waiting_since_ms"].map(String::from)),
        "by_wait_shard projects what the wake and the sweeper read, nothing else"
    );
    // The relay's index, as `relay_index` in setup.rs: items with a pending delivery
    // by next attempt, projecting what the backlog metrics decode (all but the body).
    assert_eq!(types.get("relay_shard").map(String::as_str), Some("S"));
    assert_eq!(types.get("relay_due_ms").map(String::as_str), Some("N"));
    let relay = index(inbox, "by_relay_due");
    assert_eq!(
        key_schema(relay),
        vec![pair("relay_shard", "HASH"), pair("relay_due_ms", "RANGE")]
    );
    assert_eq!(
        path(relay, &["Projection", "ProjectionType"]).and_then(Value::as_str),
        Some("INCLUDE")
    );
    let projected: BTreeSet<String> = list(path(relay, &["Projection", "NonKeyAttributes"]))
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    assert_eq!(
        projected,
        RELAY_INDEX_PROJECTION
            .iter()
            .map(|a| a.to_string())
            .collect::<BTreeSet<_>>(),
        "by_relay_due projects what the code decodes from it"
    );
    // The dead-lettered deliveries' index, as `relay_dead_index` in setup.rs: items
    // with a dead-lettered delivery by when, projecting what the relay index does.
    assert_eq!(types.get("relay_dead_shard").map(String::as_str), Some("S"));
    assert_eq!(types.get("relay_dead_ms").map(String::as_str), Some("N"));
    let dead = index(inbox, "by_relay_dead");
    assert_eq!(
        key_schema(dead),
        vec![
            pair("relay_dead_shard", "HASH"),
            pair("relay_dead_ms", "RANGE")
        ]
    );
    let projected: BTreeSet<String> = list(path(dead, &["Projection", "NonKeyAttributes"]))
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    assert_eq!(
        projected,
        RELAY_INDEX_PROJECTION
            .iter()
            .map(|a| a.to_string())
            .collect::<BTreeSet<_>>(),
        "by_relay_dead projects what the code decodes from it"
    );
    assert_eq!(
        path(inbox, &["TimeToLiveSpecification", "AttributeName"]).and_then(Value::as_str),
        Some("expires_at")
    );
    assert_eq!(
        path(inbox, &["TimeToLiveSpecification", "Enabled"]).and_then(Value::as_bool),
        Some(true)
    );

    // State: as `create_state_table` in shared/src/adapters/aws/state.rs.
    let state = props(resource(&t, "StateTable"));
    let expected: Vec<(String, String)> =
        STATE_KEY_SCHEMA.iter().map(|(a, k)| pair(a, k)).collect();
    assert_eq!(key_schema(state), expected);
    // No index: every record write would repeat in it.
    assert!(get(state, "GlobalSecondaryIndexes").is_none());
    let types = attribute_types(state);
    assert_eq!(types.get("tenant_kind").map(String::as_str), Some("S"));
    assert_eq!(types.get("id").map(String::as_str), Some("S"));
    // Mark-only items expire.
    assert_eq!(
        path(state, &["TimeToLiveSpecification", "AttributeName"]).and_then(Value::as_str),
        Some("expires_at")
    );

    // Audit: as `create_audit_table` in shared/src/adapters/aws/audit.rs.
    let audit = props(resource(&t, "AuditTable"));
    assert_eq!(
        key_schema(audit),
        vec![pair("pk", "HASH"), pair("sk", "RANGE")]
    );
}

#[test]
fn functions_are_arm64_rust_binaries_with_json_logs_and_tracing() {
    let t = template();
    let globals = path(&t, &["Globals", "Function"])
        .cloned()
        .unwrap_or(Value::Null);
    let setting = |p: &Value, key: &str| get(p, key).or_else(|| get(&globals, key)).cloned();
    let found: BTreeSet<String> = resources_of(&t, "AWS::Serverless::Function")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(found, FUNCTIONS.iter().map(|s| s.to_string()).collect());
    for name in FUNCTIONS {
        let function = resource(&t, name);
        let p = props(function);
        assert_eq!(
            setting(p, "Runtime").as_ref().and_then(Value::as_str),
            Some("provided.al2023"),
            "{name}"
        );
        assert_eq!(
            setting(p, "Handler").as_ref().and_then(Value::as_str),
            Some("bootstrap"),
            "{name}"
        );
        // Active by default; `TracingMode` may turn it down to PassThrough (cost).
        let tracing = setting(p, "Tracing").expect("Tracing is set");
        assert_eq!(resolve(&t, &tracing).as_deref(), Some("Active"), "{name}");
        let arch = list(setting(p, "Architectures").as_ref());
        assert_eq!(arch, vec![Value::from("arm64")], "{name}");
        assert!(
            get(p, "MemorySize").is_some(),
            "{name}: memory size is part of the cost model"
        );

        // Built by cargo-lambda from the crate of the same name.
        let meta = get(function, "Metadata").expect("Metadata");
        assert_eq!(
            get(meta, "BuildMethod").and_then(Value::as_str),
            Some("rust-cargolambda"),
            "{name}"
        );
        let binary = path(meta, &["BuildProperties", "Binary"])
            .and_then(Value::as_str)
            .unwrap();
        let code_uri = get(p, "CodeUri").and_then(Value::as_str).unwrap();
        assert_eq!(code_uri, format!("../functions/{binary}"), "{name}");
        let manifest = repo_root()
            .join("functions")
            .join(binary)
            .join("Cargo.toml");
        let cargo = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        assert!(
            cargo.contains(&format!("name = \"{binary}\"")),
            "{}: no bin {binary}",
            manifest.display()
        );

        // JSON logs into an explicit log group with a retention.
        let logging = get(p, "LoggingConfig").expect("LoggingConfig");
        assert_eq!(
            get(logging, "LogFormat").and_then(Value::as_str),
            Some("JSON"),
            "{name}"
        );
        let group = get(logging, "LogGroup")
            .and_then(ref_target)
            .expect("LogGroup: !Ref");
        assert_eq!(
            resource_type(&t, group),
            Some("AWS::Logs::LogGroup"),
            "{name}"
        );
        assert!(
            get(props(resource(&t, group)), "RetentionInDays").is_some(),
            "{group}"
        );
    }
}

/// A user's own domain is deployed by pointing the processor's `CodeUri` and `Binary`
/// at its crate (docs/your-domain.md): the example crate is a workspace member whose
/// `custom-domain-processor` binary runs the library's `processor::run`, so the rest
/// of the template (environment, policies, event source) applies unchanged.
#[test]
fn a_domain_crate_can_replace_the_processor_by_its_code_uri() {
    let t = template();
    let function = resource(&t, "ProcessorFunction");
    let binary = path(
        get(function, "Metadata").expect("Metadata"),
        &["BuildProperties", "Binary"],
    )
    .and_then(Value::as_str)
    .unwrap();
    assert_eq!(binary, "processor");
    let example = repo_root().join("examples/custom-domain");
    let cargo = std::fs::read_to_string(example.join("Cargo.toml")).expect("example Cargo.toml");
    let bin = "[[bin]]\nname = \"custom-domain-processor\"\npath = \"src/main.rs\"";
    assert!(
        cargo.contains(bin),
        "examples/custom-domain has no bin custom-domain-processor at src/main.rs"
    );
    // The docs' two-line switch names exactly these.
    let docs = std::fs::read_to_string(repo_root().join("docs/your-domain.md")).expect("docs");
    for line in [
        "Binary: custom-domain-processor",
        "CodeUri: ../examples/custom-domain",
    ] {
        assert!(docs.contains(line), "docs/your-domain.md lacks `{line}`");
    }
    let main = std::fs::read_to_string(example.join("src/main.rs")).expect("example main.rs");
    assert!(
        main.contains("processor::run("),
        "the example's main runs processor::run"
    );
    let workspace = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("workspace");
    assert!(
        workspace.contains("\"examples/custom-domain\""),
        "the example is a workspace member"
    );
}

#[test]
fn the_api_routes_every_webhook_path_to_the_receiver() {
    let t = template();
    let events = get(props(resource(&t, "ReceiverFunction")), "Events")
        .and_then(Value::as_mapping)
        .expect("receiver events");
    let routes: BTreeSet<(String, String)> = events
        .values()
        .filter(|e| get(e, "Type").and_then(Value::as_str) == Some("HttpApi"))
        .map(|e| {
            let p = props(e);
            assert_eq!(get(p, "ApiId").and_then(ref_target), Some("WebhookApi"));
            (
                get(p, "Method")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_uppercase(),
                get(p, "Path").and_then(Value::as_str).unwrap().to_string(),
            )
        })
        .collect();
    let mut expected = BTreeSet::new();
    for method in ["POST", "GET"] {
        for p in [
            "/webhooks/{provider}/{tenant}",
            "/webhooks/{provider}/{tenant}/{token}",
        ] {
            expected.insert((method.to_string(), p.to_string()));
        }
    }
    assert_eq!(routes, expected);
    // Nothing else is exposed.
    for name in FUNCTIONS.iter().filter(|f| **f != "ReceiverFunction") {
        let events = get(props(resource(&t, name)), "Events").and_then(Value::as_mapping);
        let http = events
            .into_iter()
            .flat_map(|m| m.values())
            .any(|e| get(e, "Type").and_then(Value::as_str) == Some("HttpApi"));
        assert!(!http, "{name} is reachable over HTTP");
    }
}

/// The reconciler finds GoPay / Klarna push hints through the sparse `by_hint` index
/// (as `create_tables` and `shared/src/adapters/aws/hints.rs`): a Query on the index
/// and BatchGetItem on the table; no function may Scan anything.
#[test]
fn the_reconciler_queries_the_hint_index_and_no_function_scans() {
    let t = template();
    let inbox = props(resource(&t, "InboxTable"));
    assert_eq!(
        attribute_types(inbox).get("hint_scope").map(String::as_str),
        Some("S")
    );
    let by_hint = index(inbox, "by_hint");
    assert_eq!(
        key_schema(by_hint),
        vec![pair("hint_scope", "HASH"), pair("received_at_ms", "RANGE")]
    );
    // Keys only: a hint's state changes never write the index.
    assert_eq!(
        path(by_hint, &["Projection", "ProjectionType"]).and_then(Value::as_str),
        Some("KEYS_ONLY")
    );

    for (name, function) in resources_of(&t, "AWS::Serverless::Function") {
        let (inline, _) = statements(function);
        for s in &inline {
            for action in list(get(s, "Action")) {
                assert_ne!(action.as_str(), Some("dynamodb:Scan"), "{name}: {s:?}");
            }
        }
    }
    let (inline, _) = statements(resource(&t, "ReconcilerFunction"));
    let resources_of_action = |wanted: &str| -> Vec<String> {
        inline
            .iter()
            .filter(|s| {
                list(get(s, "Action"))
                    .iter()
                    .any(|a| a.as_str() == Some(wanted))
            })
            .flat_map(|s| list(get(s, "Resource")))
            .map(|r| describe_value(&r))
            .collect()
    };
    let query = resources_of_action("dynamodb:Query");
    assert!(
        query.len() == 1 && query[0].contains("${InboxTable.Arn}/index/by_hint"),
        "reconciler Query only on the by_hint index: {query:?}"
    );
    assert!(
        resources_of_action("dynamodb:BatchGetItem").contains(&"GetAtt:InboxTable.Arn".to_string()),
        "reconciler reads hint states with BatchGetItem on the inbox"
    );
}

// ------------------------------------------------------------------ conditions

fn scaling_resources(t: &Value) -> usize {
    resources_of(t, "AWS::ApplicationAutoScaling::ScalableTarget").len()
        + resources_of(t, "AWS::ApplicationAutoScaling::ScalingPolicy").len()
}

/// `TableBillingMode=PROVISIONED`: every table and every global secondary index gets
/// provisioned capacity (the minimum parameters) and one scalable target with one
/// target-tracking policy (70 %) for reads and one for writes; on-demand (the
/// default) has none of it.
#[test]
fn provisioned_mode_scales_every_table_and_index() {
    let t = template();

    let on_demand = render(&t, &[]);
    for (name, table) in resources_of(&on_demand, "AWS::DynamoDB::Table") {
        let p = props(table);
        assert_eq!(
            get(p, "BillingMode")
                .and_then(|v| resolve(&on_demand, v))
                .as_deref(),
            Some("PAY_PER_REQUEST"),
            "{name}"
        );
        assert!(get(p, "ProvisionedThroughput").is_none(), "{name}");
        for gsi in list(get(p, "GlobalSecondaryIndexes")) {
            assert!(
                get(&gsi, "ProvisionedThroughput").is_none(),
                "{name}: {gsi:?}"
            );
        }
    }
    assert_eq!(
        scaling_resources(&on_demand),
        0,
        "auto scaling without PROVISIONED"
    );

    let r = render(&t, &[("TableBillingMode", "PROVISIONED")]);
    let throughput = |what: &str, v: &Value| {
        let block = get(v, "ProvisionedThroughput")
            .unwrap_or_else(|| panic!("{what}: no ProvisionedThroughput"));
        for kind in ["Read", "Write"] {
            assert_eq!(
                get(block, &format!("{kind}CapacityUnits")).and_then(ref_target),
                Some(format!("TableMin{kind}Capacity").as_str()),
                "{what}: initial {kind} capacity is the minimum"
            );
        }
    };
    // (ResourceId, table or index) of everything that must scale.
    let mut expected: BTreeSet<(String, &str)> = BTreeSet::new();
    for (name, table) in resources_of(&r, "AWS::DynamoDB::Table") {
        let p = props(table);
        assert_eq!(
            get(p, "BillingMode")
                .and_then(|v| resolve(&r, v))
                .as_deref(),
            Some("PROVISIONED"),
            "{name}"
        );
        throughput(&name, p);
        expected.insert((format!("table/${{{name}}}"), "table"));
        for gsi in list(get(p, "GlobalSecondaryIndexes")) {
            let index = get(&gsi, "IndexName").and_then(Value::as_str).unwrap();
            throughput(&format!("{name}/{index}"), &gsi);
            expected.insert((format!("table/${{{name}}}/index/{index}"), "index"));
        }
    }
    // inbox + by_sweep_shard + by_hint + by_wait_shard + by_relay_due + by_relay_dead,
    // state, audit
    assert_eq!(expected.len(), 8, "{expected:?}");

    // (ResourceId, Read/Write) → the scalable target's logical id
    let mut targets: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut kind_of: BTreeMap<String, String> = BTreeMap::new();
    for (id, target) in resources_of(&r, "AWS::ApplicationAutoScaling::ScalableTarget") {
        let p = props(target);
        assert_eq!(
            get(p, "ServiceNamespace").and_then(Value::as_str),
            Some("dynamodb"),
            "{id}"
        );
        let resource_id = get(p, "ResourceId").and_then(sub_text).expect("ResourceId");
        let dimension = get(p, "ScalableDimension")
            .and_then(Value::as_str)
            .expect("ScalableDimension");
        let (level, kind) = match dimension.split(':').collect::<Vec<_>>()[..] {
            ["dynamodb", level, units] => (
                level.to_string(),
                units
                    .strip_suffix("CapacityUnits")
                    .unwrap_or_else(|| panic!("{id}: {dimension}"))
                    .to_string(),
            ),
            _ => panic!("{id}: {dimension}"),
        };
        assert!(
            expected.contains(&(resource_id.clone(), level.as_str())),
            "{id}: {resource_id} as {level} is not a table or index of the template"
        );
        for bound in ["Min", "Max"] {
            assert_eq!(
                get(p, &format!("{bound}Capacity")).and_then(ref_target),
                Some(format!("Table{bound}{kind}Capacity").as_str()),
                "{id}"
            );
        }
        let role = get(p, "RoleARN").and_then(sub_text).unwrap_or_default();
        assert!(
            role.ends_with(
                ":role/aws-service-role/dynamodb.application-autoscaling.amazonaws.com/AWSServiceRoleForApplicationAutoScaling_DynamoDBTable"
            ),
            "{id}: DynamoDB's service-linked auto scaling role, not {role:?}"
        );
        kind_of.insert(id.clone(), kind.clone());
        let previous = targets.insert((resource_id.clone(), kind.clone()), id.clone());
        assert!(previous.is_none(), "{resource_id} {kind} scaled twice");
    }
    let wanted: BTreeSet<(String, String)> = expected
        .iter()
        .flat_map(|(resource_id, _)| {
            ["Read", "Write"].map(|kind| (resource_id.clone(), kind.to_string()))
        })
        .collect();
    assert_eq!(
        targets.keys().cloned().collect::<BTreeSet<_>>(),
        wanted,
        "every table and index scales reads and writes"
    );

    let mut policies: BTreeMap<String, usize> = BTreeMap::new();
    for (id, policy) in resources_of(&r, "AWS::ApplicationAutoScaling::ScalingPolicy") {
        let p = props(policy);
        assert_eq!(
            get(p, "PolicyType").and_then(Value::as_str),
            Some("TargetTrackingScaling"),
            "{id}"
        );
        let target = get(p, "ScalingTargetId")
            .and_then(ref_target)
            .unwrap_or_else(|| panic!("{id}: ScalingTargetId is no !Ref"));
        let kind = kind_of
            .get(target)
            .unwrap_or_else(|| panic!("{id}: {target} is no scalable target"));
        let config = get(p, "TargetTrackingScalingPolicyConfiguration").expect("configuration");
        assert_eq!(
            get(config, "TargetValue").and_then(|v| resolve_number(&r, v)),
            Some(70.0),
            "{id}"
        );
        assert_eq!(
            path(
                config,
                &["PredefinedMetricSpecification", "PredefinedMetricType"]
            )
            .and_then(Value::as_str),
            Some(format!("DynamoDB{kind}CapacityUtilization").as_str()),
            "{id}"
        );
        *policies.entry(target.to_string()).or_default() += 1;
    }
    for target in targets.values() {
        assert_eq!(policies.get(target), Some(&1), "{target}: one policy");
    }
}

/// `ReceiverFunctionUrl=true`: a public function URL (AuthType NONE; the receiver
/// verifies signatures) on the receiver, both grants scoped to it (the direct invoke
/// only through the URL), its 5xx alarm and its output. Off by default; the HTTP API
/// stays either way. Reserved concurrency: unset without the URL unless given; with the
/// URL (no API throttling in front of it) 50 by default, the given value, or none only
/// when asked for explicitly (`none`).
#[test]
fn the_function_url_is_optional_public_and_reaches_only_the_receiver() {
    let t = template();
    let url_alarm = |r: &Value| {
        alarm_metrics(r).unwrap().into_iter().any(|m| {
            m.namespace == "AWS/Lambda"
                && m.name == "Url5xxCount"
                && m.dimensions.get("FunctionName").map(String::as_str)
                    == Some("Ref:ReceiverFunction")
        })
    };
    let api_routes = |r: &Value| {
        get(props(resource(r, "ReceiverFunction")), "Events")
            .and_then(Value::as_mapping)
            .map(|events| {
                events
                    .values()
                    .filter(|e| get(e, "Type").and_then(Value::as_str) == Some("HttpApi"))
                    .count()
            })
            .unwrap_or(0)
    };

    let off = render(&t, &[]);
    for kind in ["AWS::Lambda::Url", "AWS::Lambda::Permission"] {
        assert!(resources_of(&off, kind).is_empty(), "{kind} by default");
    }
    assert!(path(&off, &["Outputs", "WebhookFunctionUrlBase"]).is_none());
    assert!(!url_alarm(&off));
    assert!(
        get(
            props(resource(&off, "ReceiverFunction")),
            "ReservedConcurrentExecutions"
        )
        .is_none(),
        "reserved concurrency is opt-in"
    );
    assert_eq!(api_routes(&off), 4);

    let on = render(
        &t,
        &[
            ("ReceiverFunctionUrl", "true"),
            ("ReceiverReservedConcurrency", "50"),
        ],
    );
    let urls = resources_of(&on, "AWS::Lambda::Url");
    let [(url_id, url)] = urls.as_slice() else {
        panic!("one function URL, found {}", urls.len());
    };
    let p = props(url);
    assert_eq!(get(p, "AuthType").and_then(Value::as_str), Some("NONE"));
    assert_eq!(
        get(p, "TargetFunctionArn").and_then(getatt),
        Some(pair("ReceiverFunction", "Arn"))
    );
    assert!(get(p, "Qualifier").is_none(), "the URL serves $LATEST");

    let mut actions = BTreeSet::new();
    for (id, permission) in resources_of(&on, "AWS::Lambda::Permission") {
        let p = props(permission);
        assert_eq!(
            get(p, "FunctionName").and_then(ref_target),
            Some("ReceiverFunction"),
            "{id}: only the receiver is public"
        );
        assert_eq!(
            get(p, "Principal").and_then(Value::as_str),
            Some("*"),
            "{id}"
        );
        let action = get(p, "Action")
            .and_then(Value::as_str)
            .unwrap()
            .to_string();
        match action.as_str() {
            "lambda:InvokeFunctionUrl" => assert_eq!(
                get(p, "FunctionUrlAuthType").and_then(Value::as_str),
                Some("NONE"),
                "{id}"
            ),
            // Without InvokedViaFunctionUrl anyone could invoke the function directly.
            "lambda:InvokeFunction" => assert_eq!(
                get(p, "InvokedViaFunctionUrl").and_then(Value::as_bool),
                Some(true),
                "{id}: the public invoke grant holds only through the URL"
            ),
            other => panic!("{id}: {other}"),
        }
        assert!(actions.insert(action), "{id}: a second grant");
    }
    assert_eq!(
        actions,
        BTreeSet::from([
            "lambda:InvokeFunctionUrl".to_string(),
            "lambda:InvokeFunction".to_string()
        ])
    );
    let output = path(&on, &["Outputs", "WebhookFunctionUrlBase", "Value"])
        .and_then(sub_text)
        .expect("WebhookFunctionUrlBase");
    assert_eq!(output, format!("${{{url_id}.FunctionUrl}}webhooks"));
    assert!(url_alarm(&on), "no Url5xxCount alarm on the receiver");
    assert_eq!(
        get(
            props(resource(&on, "ReceiverFunction")),
            "ReservedConcurrentExecutions"
        )
        .and_then(|v| resolve(&on, v))
        .as_deref(),
        Some("50")
    );
    let reserved = |overrides: &[(&str, &str)]| {
        let r = render(&t, overrides);
        get(
            props(resource(&r, "ReceiverFunction")),
            "ReservedConcurrentExecutions",
        )
        .and_then(|v| resolve(&r, v))
    };
    assert_eq!(
        reserved(&[("ReceiverFunctionUrl", "true")]).as_deref(),
        Some("50"),
        "a public function URL gets a reserved concurrency by default"
    );
    assert_eq!(
        reserved(&[
            ("ReceiverFunctionUrl", "true"),
            ("ReceiverReservedConcurrency", "none")
        ]),
        None,
        "`none` opts out explicitly"
    );
    assert_eq!(
        reserved(&[("ReceiverReservedConcurrency", "20")]).as_deref(),
        Some("20"),
        "without the URL a given value still applies"
    );
    // The function URL is additional: the HTTP API keeps every route.
    assert_eq!(resources_of(&on, "AWS::Serverless::HttpApi").len(), 1);
    assert_eq!(api_routes(&on), 4);
}

/// The relay's retries run in the sweeper: it alone queries the `by_relay_due` index
/// (as `shared/src/adapters/aws/relay.rs`), reads the tenant configuration (the
/// destinations), and both delivering functions may read and update the inbox table
/// (relay lease, order cursors).
#[test]
fn the_sweeper_queries_the_relay_index_and_both_relays_reach_the_inbox() {
    let t = template();
    let grants = |function: &str, wanted: &str| -> Vec<String> {
        let (inline, _) = statements(resource(&t, function));
        inline
            .iter()
            .filter(|s| {
                list(get(s, "Action"))
                    .iter()
                    .any(|a| a.as_str() == Some(wanted))
            })
            .flat_map(|s| list(get(s, "Resource")))
            .map(|r| describe_value(&r))
            .collect()
    };
    let relay_index = |function: &str| {
        grants(function, "dynamodb:Query")
            .iter()
            .any(|r| r.contains("${InboxTable.Arn}/index/by_relay_due"))
    };
    assert!(relay_index("SweeperFunction"), "the sweeper runs run_due");
    for function in [
        "ReceiverFunction",
        "ProcessorFunction",
        "ReconcilerFunction",
    ] {
        assert!(!relay_index(function), "{function} queries the relay index");
    }
    for function in ["ProcessorFunction", "SweeperFunction"] {
        for action in ["dynamodb:GetItem", "dynamodb:UpdateItem"] {
            assert!(
                grants(function, action).contains(&"GetAtt:InboxTable.Arn".to_string()),
                "{function} lacks {action} on the inbox table"
            );
        }
        assert!(
            grants(function, "ssm:GetParameter")
                .iter()
                .any(|r| r.contains("parameter${ConfigParameterName}")),
            "{function} cannot read the destinations"
        );
    }
}
