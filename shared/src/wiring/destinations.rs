//! Parsing and checking of the `[[destination]]` tables of the tenant TOML (called
//! by the loader, [`super::load`], whose style it keeps: every problem collected with its line,
//! the nearest valid name suggested, secrets inline or `{ env = "VAR" }` and never
//! printed). Fields are read by hand from the table, not by serde, because which
//! fields are valid depends on `kind`, and each problem must name its destination.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::kinds::{self, KINDS};
use crate::config::RawDestination;
use crate::destinations::config::*;
use crate::destinations::fields::Fields;
use crate::destinations::filter::validate_pattern;
use crate::problems::{did_you_mean, is_valid_name, line_of, nearest, Problem};
use crate::providers;
use crate::secret::SecretLookup;

const COMMON: &[&str] = &[
    "name",
    "tenant",
    "provider",
    "kind",
    "events",
    "outputs",
    "ordered",
    "max_attempts",
    "max_age_secs",
];
const MAX_ATTEMPTS_LIMIT: u64 = 1000;

/// Check every destination; problems go to `problems`. `tenants` are the
/// (provider, tenant) pairs of the `[[tenant]]` tables as written (also those with
/// problems of their own, so one mistake is reported once).
pub(crate) fn parse_destinations(
    text: &str,
    raws: Vec<RawDestination>,
    tenants: &BTreeSet<(String, String)>,
    lookup: SecretLookup<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<DestinationConfig> {
    let mut out: Vec<DestinationConfig> = Vec::new();
    for (index, raw) in raws.into_iter().enumerate() {
        let line = raw
            .keys()
            .map(|k| line_of(text, k.span().start))
            .min()
            .unwrap_or(1);
        let fields = raw
            .into_iter()
            .map(|(k, v)| {
                let line = line_of(text, k.span().start);
                (k.into_inner(), (line, v))
            })
            .collect();
        let mut f = Fields {
            line,
            fields,
            label: format!("destination #{}", index + 1),
            problems: Vec::new(),
        };
        if let Some(destination) = parse_one(&mut f, tenants, lookup) {
            if out
                .iter()
                .any(|d| d.tenant == destination.tenant && d.name == destination.name)
            {
                f.problem(
                    line,
                    "configured twice for this tenant (names must be unique per tenant)",
                );
            } else {
                out.push(destination);
            }
        }
        problems.append(&mut f.problems);
    }
    let mut per_tenant: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &out {
        *per_tenant.entry(&d.tenant).or_default() += 1;
    }
    for (tenant, count) in per_tenant {
        if count > MAX_DESTINATIONS_PER_TENANT {
            problems.push(Problem {
                line: 1,
                message: format!(
                    "tenant {tenant}: {count} destinations, at most {MAX_DESTINATIONS_PER_TENANT} are allowed"
                ),
            });
        }
    }
    out
}

fn parse_one(
    f: &mut Fields,
    tenants: &BTreeSet<(String, String)>,
    lookup: SecretLookup<'_>,
) -> Option<DestinationConfig> {
    let line = f.line;
    let name = f.required_string("name");
    let tenant = f.required_string("tenant");
    let (Some((_, name)), Some((tenant_line, tenant))) = (name, tenant) else {
        return None;
    };
    f.label = format!("destination {tenant}/{name}");
    if !is_valid_name(&name) || !is_valid_name(&tenant) {
        f.problem(
            line,
            "destination and tenant names may only use letters, digits, '-', '_' and '.'",
        );
        return None;
    }
    let provider = f.string("provider");
    let mut ok = true;
    if let Some((pline, p)) = &provider {
        if providers::lookup(p).is_none() {
            let known = providers::all().iter().map(|p| p.name());
            f.problem(
                *pline,
                format!("unknown provider `{p}`{}", did_you_mean(nearest(p, known))),
            );
            ok = false;
        } else if !tenants.contains(&(p.clone(), tenant.clone())) {
            f.problem(
                tenant_line,
                format!("no [[tenant]] entry for provider {p} and tenant {tenant}"),
            );
            ok = false;
        }
    } else if !tenants.iter().any(|(_, t)| *t == tenant) {
        f.problem(
            tenant_line,
            format!("tenant `{tenant}` has no [[tenant]] entry"),
        );
        ok = false;
    }
    let before = f.problems.len();
    let (events_line, events) = f.string_list("events");
    let (outputs_line, outputs) = f.string_list("outputs");
    // A list given in the wrong shape is its own problem, not "nothing to receive".
    let malformed = f.problems.len() > before;
    for (pline, pattern) in events
        .iter()
        .map(|p| (events_line, p))
        .chain(outputs.iter().map(|p| (outputs_line, p)))
    {
        if let Err(reason) = validate_pattern(pattern) {
            f.problem(pline, reason);
            ok = false;
        }
    }
    if events.is_empty() && outputs.is_empty() && !malformed {
        f.problem(
            line,
            "neither `events` nor `outputs`: the destination would receive nothing",
        );
        ok = false;
    }
    let ordered = f.bool("ordered", false);
    let max_attempts = f.number(
        "max_attempts",
        u64::from(DEFAULT_MAX_ATTEMPTS),
        1,
        MAX_ATTEMPTS_LIMIT,
    ) as u32;
    let max_age =
        Duration::from_secs(f.number("max_age_secs", DEFAULT_MAX_AGE_SECS, 1, 365 * 24 * 3600));
    let (kind_line, kind_name) = f.required_string("kind")?;
    let Some(kind) = kinds::kind(&kind_name) else {
        let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        f.problem(
            kind_line,
            format!(
                "unknown kind `{kind_name}`{} (kinds: {})",
                did_you_mean(nearest(&kind_name, known.iter().copied())),
                known.join(", ")
            ),
        );
        return None;
    };
    let (kind_fields, parsed) = (kind.fields, (kind.parse)(f, lookup));
    // What is left is not a field of this kind.
    let unknown: Vec<(String, usize)> = std::mem::take(&mut f.fields)
        .into_iter()
        .map(|(k, (l, _))| (k, l))
        .collect();
    for (field, fline) in unknown {
        let owner = KINDS
            .iter()
            .find(|k| k.fields.contains(&field.as_str()))
            .map(|k| k.name);
        let message = match owner {
            Some(owner) => {
                format!(
                    "`{field}` is not an option of kind {kind_name} (it belongs to kind {owner})"
                )
            }
            None => {
                let valid = COMMON.iter().chain(kind_fields.iter()).copied();
                format!(
                    "unknown field `{field}` for kind {kind_name}{}",
                    did_you_mean(nearest(&field, valid))
                )
            }
        };
        f.problem(fline, message);
        ok = false;
    }
    let kind = parsed?;
    ok.then(|| DestinationConfig {
        name,
        tenant,
        provider: provider.map(|(_, p)| p),
        events,
        outputs,
        ordered,
        max_attempts,
        max_age,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::postgres::DEFAULT_POOL_SIZE;
    use crate::config::Config;
    use crate::destinations::http::{BodyFormat, DEFAULT_HTTP_TIMEOUT};

    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

    const TENANTS: &str = r#"
[[tenant]]
provider = "stripe"
tenant = "demo"
secrets = ["whsec_x"]

[[tenant]]
provider = "github"
tenant = "demo"
secrets = ["hush"]
"#;

    fn load(destinations: &str) -> Result<Config, Vec<String>> {
        let text = format!("{TENANTS}{destinations}");
        Config::from_toml_named(&text, "e.toml", |v| match v {
            "SHOP_SECRET" => Some(SECRET.into()),
            "PG_DSN" => Some("postgresql://einmal:pw@db.example/app".into()),
            _ => None,
        })
        .map_err(|e| e.lines())
    }

    /// The problems, without the `e.toml:N: ` prefix (lines are checked separately).
    fn problems(destinations: &str) -> Vec<String> {
        load(destinations)
            .unwrap_err()
            .into_iter()
            .map(|l| l.splitn(3, ':').nth(2).unwrap().trim().to_string())
            .collect()
    }

    #[test]
    fn every_kind_parses_with_its_options_and_defaults() {
        let cfg = load(
            r#"
[[destination]]
name = "shop-app"
tenant = "demo"
provider = "stripe"
kind = "http"
events = ["payment_intent.*", "charge.refunded"]
outputs = ["notification.*"]
ordered = true
max_attempts = 5
max_age_secs = 3600
url = "https://shop.example/webhooks/einmal"
secrets = [{ env = "SHOP_SECRET" }, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
body = "envelope"
timeout_ms = 2500

[[destination]]
name = "local"
tenant = "demo"
kind = "http"
events = ["*"]
url = "http://localhost:3000/webhooks"
secrets = ["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"]

[[destination]]
name = "queue"
tenant = "demo"
kind = "sqs"
events = ["*"]
queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/shop.fifo"

[[destination]]
name = "bus"
tenant = "demo"
kind = "eventbridge"
events = ["*"]

[[destination]]
name = "fn"
tenant = "demo"
kind = "lambda"
outputs = ["*"]
function = "arn:aws:lambda:eu-west-1:123456789012:function:shop"

[[destination]]
name = "db"
tenant = "demo"
kind = "postgres"
events = ["*"]
dsn = { env = "PG_DSN" }
table = "app.einmal_events"
pool_size = 8

[[destination]]
name = "localdb"
tenant = "demo"
kind = "postgres"
events = ["*"]
dsn = "host=127.0.0.1 port=5432 user=einmal dbname=app"
table = "events"
"#,
        )
        .unwrap();
        let d = cfg.destinations();
        assert_eq!(d.len(), 7);
        assert_eq!(d[0].name, "shop-app");
        assert_eq!(d[0].provider.as_deref(), Some("stripe"));
        assert_eq!(d[0].events, ["payment_intent.*", "charge.refunded"]);
        assert_eq!(d[0].outputs, ["notification.*"]);
        assert!(d[0].ordered);
        assert_eq!(
            (d[0].max_attempts, d[0].max_age),
            (5, Duration::from_secs(3600))
        );
        let DestinationKind::Http(http) = &d[0].kind else {
            panic!()
        };
        assert_eq!(http.url, "https://shop.example/webhooks/einmal");
        assert_eq!(http.secrets.len(), 2);
        assert_eq!(http.secrets[0].expose(), SECRET);
        assert_eq!(http.body, BodyFormat::Envelope);
        assert_eq!(http.timeout, Duration::from_millis(2500));
        assert!(!http.allow_private);
        let DestinationKind::Http(local) = &d[1].kind else {
            panic!()
        };
        assert_eq!(
            (local.body, local.timeout),
            (BodyFormat::Original, DEFAULT_HTTP_TIMEOUT)
        );
        assert_eq!(d[1].max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(d[1].max_age, Duration::from_secs(DEFAULT_MAX_AGE_SECS));
        assert!(matches!(&d[2].kind, DestinationKind::Sqs(q) if q.is_fifo()));
        assert!(matches!(&d[3].kind, DestinationKind::EventBridge(b) if b.bus == "default"));
        assert!(matches!(&d[4].kind, DestinationKind::Lambda(l) if l.function.ends_with(":shop")));
        let DestinationKind::Postgres(pg) = &d[5].kind else {
            panic!()
        };
        assert_eq!(
            (pg.table.as_str(), pg.tls, pg.pool_size),
            ("app.einmal_events", true, 8)
        );
        let DestinationKind::Postgres(local) = &d[6].kind else {
            panic!()
        };
        assert_eq!((local.tls, local.pool_size), (false, DEFAULT_POOL_SIZE));
        // Per provider and tenant: the stripe-only destination is not github's.
        let github: Vec<_> = cfg
            .destinations_for("github", "demo")
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(github, ["local", "queue", "bus", "fn", "db", "localdb"]);
        assert_eq!(cfg.destinations_for("stripe", "demo").count(), 7);
        assert_eq!(cfg.destinations_for("stripe", "other").count(), 0);
        // Secrets never print.
        assert!(!format!("{cfg:?}").contains("C2FVsBQI"));
        assert!(!format!("{cfg:?}").contains(":pw@"));
    }

    #[test]
    fn unknown_kinds_and_fields_are_named_with_suggestions() {
        assert_eq!(
            problems("[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"htp\"\nevents = [\"*\"]\n"),
            ["destination demo/a: unknown kind `htp` (did you mean `http`?) (kinds: http, sqs, eventbridge, lambda, postgres)"]
        );
        let p = problems(&format!(
            "[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"http\"\nevents = [\"*\"]\nurl = \"https://x.example/\"\nsecrets = [\"{SECRET}\"]\ntimeuot_ms = 5\nqueue_url = \"q\"\ncolour = 1\n"
        ));
        assert_eq!(
            p,
            [
                "destination demo/a: unknown field `timeuot_ms` for kind http (did you mean `timeout_ms`?)",
                "destination demo/a: `queue_url` is not an option of kind http (it belongs to kind sqs)",
                "destination demo/a: unknown field `colour` for kind http",
            ]
        );
    }

    #[test]
    fn http_secrets_must_be_present_and_standard() {
        let base = "[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"http\"\nevents = [\"*\"]\nurl = \"https://x.example/\"\n";
        assert_eq!(
            problems(base),
            ["destination demo/a: missing `secrets`: an HTTP destination signs every delivery (`whsec_` + base64, e.g. from `einmal listen`)"]
        );
        assert_eq!(
            problems(&format!("{base}secrets = []\n"))[0],
            "destination demo/a: `secrets` must be a non-empty list of secrets (strings, { env = \"VARIABLE\" } or { ssm = \"/parameter\" })"
        );
        let p = problems(&format!(
            "{base}secrets = [\"topsecretvalue\", \"whsec_AAAAAAAAAAAAAAAA\", \"whsec_!!\", {{ env = \"UNSET_VAR\" }}]\n"
        ));
        assert_eq!(
            p,
            [
                "destination demo/a: a signing secret must start with `whsec_`",
                "destination demo/a: a signing secret must decode to 24 to 64 bytes (this one has 12)",
                "destination demo/a: a signing secret must be `whsec_` followed by base64",
                "destination demo/a: `secrets` refers to environment variable UNSET_VAR, which is not set",
            ]
        );
        assert!(!p.concat().contains("topsecretvalue"));
    }

    #[test]
    fn urls_must_be_https_except_to_loopback_and_never_private_unless_allowed() {
        let dest = |url: &str, extra: &str| {
            format!("[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"http\"\nevents = [\"*\"]\nsecrets = [\"{SECRET}\"]\nurl = \"{url}\"\n{extra}")
        };
        for ok in [
            "https://x.example/h",
            "http://localhost:3000/h",
            "http://127.0.0.1:9/h",
            "http://[::1]:9/h",
            "https://8.8.8.8/h",
        ] {
            assert!(load(&dest(ok, "")).is_ok(), "{ok}");
        }
        assert!(load(&dest("https://10.0.0.1/h", "allow_private = true\n")).is_ok());
        let p = problems(&dest("http://shop.example/h", ""));
        assert_eq!(p, ["destination demo/a: `url` must use https:// (plain http:// only to loopback: localhost, 127.0.0.1, [::1]), not http://shop.example/h"]);
        let p = problems(&dest("https://169.254.169.254/latest", ""));
        assert!(
            p[0].contains("refused to connect to link-local address 169.254.169.254"),
            "{p:?}"
        );
        let p = problems(&dest("ftp://x.example/h", ""));
        assert!(p[0].contains("must be an https:// URL"), "{p:?}");
        let p = problems(&dest("https://user:pw@x.example/h", ""));
        assert!(
            p[0].contains("credentials") && !p[0].contains("pw@"),
            "{p:?}"
        );
        let p = problems(&dest("not a url", ""));
        assert!(p[0].contains("not a valid URL"), "{p:?}");
    }

    /// A URL's query or fragment may carry a token: an error shows the URL without them.
    #[test]
    fn url_errors_do_not_echo_query_tokens() {
        let dest = |url: &str, extra: &str| {
            format!("[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"http\"\nevents = [\"*\"]\nsecrets = [\"{SECRET}\"]\nurl = \"{url}\"\n{extra}")
        };
        let p = problems(&dest("http://shop.example/h?token=sk_live_LEAKED#frag", ""));
        assert!(p[0].ends_with("not http://shop.example/h…"), "{p:?}");
        let p = problems(&dest("ftp://x.example/h?k=LEAKED", ""));
        assert!(p[0].ends_with("not ftp://x.example/h…"), "{p:?}");
        let sqs = "[[destination]]\nname = \"q\"\ntenant = \"demo\"\nkind = \"sqs\"\nevents = [\"*\"]\nqueue_url = \"sqs.example/q?X-Amz-Signature=LEAKED\"\n";
        let p = problems(sqs);
        assert!(p[0].contains("not `sqs.example/q…`"), "{p:?}");
        for p in [
            p,
            problems(&dest("https://x.example/h?LEAKED", "allow_private = 3\n")),
        ] {
            assert!(!p.concat().contains("LEAKED"), "{p:?}");
        }
    }

    #[test]
    fn tenants_providers_names_and_limits_are_checked() {
        let one = |name: &str, tenant: &str, extra: &str| {
            format!("[[destination]]\nname = \"{name}\"\ntenant = \"{tenant}\"\nkind = \"lambda\"\nfunction = \"f\"\nevents = [\"*\"]\n{extra}")
        };
        assert_eq!(
            problems(&one("a", "nobody", "")),
            ["destination nobody/a: tenant `nobody` has no [[tenant]] entry"]
        );
        assert_eq!(
            problems(&one("a", "demo", "provider = \"stirpe\"\n")),
            ["destination demo/a: unknown provider `stirpe` (did you mean `stripe`?)"]
        );
        assert_eq!(
            problems(&one("a", "demo", "provider = \"shopify\"\n")),
            ["destination demo/a: no [[tenant]] entry for provider shopify and tenant demo"]
        );
        assert_eq!(
            problems(&format!("{}{}", one("a", "demo", ""), one("a", "demo", ""))),
            ["destination demo/a: configured twice for this tenant (names must be unique per tenant)"]
        );
        assert!(problems(&one("a#b", "demo", ""))[0].contains("may only use letters"));
        let many: String = (0..=MAX_DESTINATIONS_PER_TENANT)
            .map(|i| one(&format!("d{i}"), "demo", ""))
            .collect();
        assert_eq!(
            problems(&many),
            ["tenant demo: 9 destinations, at most 8 are allowed"]
        );
        let p = problems("[[destination]]\ntenant = \"demo\"\nkind = \"lambda\"\n");
        assert_eq!(p, ["destination #1: missing `name`"]);
    }

    #[test]
    fn patterns_and_filters_are_checked() {
        let base = "[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"lambda\"\nfunction = \"f\"\n";
        assert_eq!(
            problems(base),
            ["destination demo/a: neither `events` nor `outputs`: the destination would receive nothing"]
        );
        let p = problems(&format!("{base}events = [\"charge refunded\", \"\"]\n"));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].contains("visible ASCII") && p[1].contains("empty"),
            "{p:?}"
        );
        assert_eq!(
            problems(&format!("{base}events = []\noutputs = []\n")),
            ["destination demo/a: neither `events` nor `outputs`: the destination would receive nothing"]
        );
        assert_eq!(
            problems(&format!("{base}events = \"*\"\n"))[0],
            "destination demo/a: `events` must be a list of strings"
        );
        assert!(
            problems(&format!("{base}events = [\"*\"]\nmax_attempts = 0\n"))[0]
                .contains("`max_attempts` must be a whole number from 1")
        );
        assert!(
            problems(&format!("{base}events = [\"*\"]\nordered = \"yes\"\n"))[0]
                .contains("`ordered` must be true or false")
        );
    }

    #[test]
    fn postgres_needs_a_dsn_and_a_plain_table_name() {
        let base = "[[destination]]\nname = \"db\"\ntenant = \"demo\"\nkind = \"postgres\"\nevents = [\"*\"]\n";
        let p = problems(&format!("{base}table = \"t\"\n"));
        assert_eq!(p, ["destination demo/db: missing `dsn` (a connection string, inline, { env = \"VARIABLE\" } or { ssm = \"/parameter\" })"]);
        let p = problems(&format!(
            "{base}dsn = {{ env = \"PG_DSN\" }}\ntable = \"events; drop table x\"\n"
        ));
        assert!(p[0].contains("is not a valid table name"), "{p:?}");
        let p = problems(&format!(
            "{base}dsn = \"postgresql://u:hunter2@h:notaport/db\"\ntable = \"t\"\n"
        ));
        assert_eq!(p, ["destination demo/db: `dsn` is not a valid PostgreSQL connection string (key=value or postgresql:// URL)"]);
    }

    #[test]
    fn sslmode_require_with_tls_false_is_a_contradiction_config_check_names() {
        let base = "[[destination]]\nname = \"db\"\ntenant = \"demo\"\nkind = \"postgres\"\nevents = [\"*\"]\ntable = \"t\"\n";
        let p = problems(&format!(
            "{base}dsn = \"host=127.0.0.1 user=u sslmode=require\"\ntls = false\n"
        ));
        assert_eq!(
            p,
            ["destination demo/db: `dsn` asks for sslmode=require but `tls = false`: set `tls = true` or drop sslmode"]
        );
        // With TLS, or without sslmode, it loads.
        assert!(load(&format!(
            "{base}dsn = \"host=127.0.0.1 user=u sslmode=require\"\ntls = true\n"
        ))
        .is_ok());
        assert!(load(&format!(
            "{base}dsn = \"host=127.0.0.1 user=u\"\ntls = false\n"
        ))
        .is_ok());
    }

    #[test]
    fn an_unset_dsn_is_the_only_problem_not_its_tls_and_pool_size() {
        let p = problems("[[destination]]\nname = \"db\"\ntenant = \"demo\"\nkind = \"postgres\"\nevents = [\"*\"]\ndsn = { env = \"UNSET_PG_DSN\" }\ntable = \"t\"\ntls = true\npool_size = 2\n");
        assert_eq!(
            p,
            ["destination demo/db: `dsn` refers to environment variable UNSET_PG_DSN, which is not set"]
        );
    }

    #[test]
    fn problems_carry_their_lines() {
        let text = format!("{TENANTS}\n[[destination]]\nname = \"a\"\ntenant = \"demo\"\nkind = \"http\"\nevents = [\"*\"]\nurl = \"http://shop.example/\"\nsecrets = [\"{SECRET}\"]\n");
        let err = Config::from_toml_named(&text, "e.toml", |_| None).unwrap_err();
        let url_line = text.lines().position(|l| l.starts_with("url")).unwrap() + 1;
        assert!(
            err.lines()[0].starts_with(&format!("e.toml:{url_line}: destination demo/a: `url`")),
            "{:?}",
            err.lines()
        );
    }
}
