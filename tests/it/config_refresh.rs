//! Secret rotation without a redeploy: the receiver's tenant configuration comes from an
//! SSM SecureString (moto) and is reloaded after its TTL.

use std::sync::Arc;
use std::time::Duration;

use einmal::adapters::aws::SsmConfigLoader;
use einmal::adapters::embedded::EmbeddedStore;
use einmal::config::Config;
use einmal::config::ConfigScope;
use einmal::config_source::{ConfigLoader, ConfigSource};
use einmal::pipeline::ingest::Ingestor;
use einmal_tests::fixtures::{signed, stripe_body};
use einmal_tests::moto;

fn toml(secrets: &[&str]) -> String {
    let list: Vec<String> = secrets.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[[tenant]]\nprovider = \"stripe\"\ntenant = \"t1\"\nsecrets = [{}]\n",
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_rotated_in_ssm_takes_effect_after_the_ttl() {
    let sdk = moto::shared().sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let name = format!("/einmal/{}/tenants", moto::unique_name("cfg"));
    let put = |value: String| {
        let ssm = ssm.clone();
        let name = name.clone();
        async move {
            ssm.put_parameter()
                .name(name)
                .value(value)
                .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
                .overwrite(true)
                .send()
                .await
                .expect("put parameter")
        }
    };
    put(toml(&["whsec_old"])).await;

    let loader = Arc::new(SsmConfigLoader {
        client: ssm.clone(),
        name: name.clone(),
        scope: ConfigScope::Whole,
    });
    let initial = loader.load().await.expect("initial config from SSM");
    let source = ConfigSource::refreshing(initial, loader, Duration::from_millis(200));
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
    let ingest = Ingestor::from_source(source, store.clone(), store.clone());

    let old = Config::from_toml(&toml(&["whsec_old"])).unwrap();
    let new = Config::from_toml(&toml(&["whsec_new"])).unwrap();
    let req = |cfg: &Config, id: &str| signed(cfg, "stripe", "t1", "", &stripe_body(id, 10));

    assert_eq!(
        ingest
            .ingest("stripe", "t1", &req(&old, "evt_r1"))
            .await
            .status,
        200
    );
    assert_eq!(
        ingest
            .ingest("stripe", "t1", &req(&new, "evt_r2"))
            .await
            .status,
        401
    );

    // Overlap: both secrets valid while the provider rolls its secret.
    put(toml(&["whsec_new", "whsec_old"])).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ingest
            .ingest("stripe", "t1", &req(&new, "evt_r3"))
            .await
            .status,
        200
    );
    assert_eq!(
        ingest
            .ingest("stripe", "t1", &req(&old, "evt_r4"))
            .await
            .status,
        200
    );

    // The old secret is retired.
    put(toml(&["whsec_new"])).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ingest
            .ingest("stripe", "t1", &req(&old, "evt_r5"))
            .await
            .status,
        401
    );
    assert_eq!(
        ingest
            .ingest("stripe", "t1", &req(&new, "evt_r6"))
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_parameter_keeps_the_last_good_configuration() {
    let sdk = moto::shared().sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let name = format!("/einmal/{}/missing", moto::unique_name("cfg"));
    let loader = Arc::new(SsmConfigLoader {
        client: ssm,
        name,
        scope: ConfigScope::Whole,
    });
    let initial = Config::from_toml(&toml(&["whsec_kept"])).unwrap();
    let source = ConfigSource::refreshing(initial.clone(), loader, Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
    let ingest = Ingestor::from_source(source, store.clone(), store.clone());
    let req = signed(&initial, "stripe", "t1", "", &stripe_body("evt_k1", 10));
    assert_eq!(ingest.ingest("stripe", "t1", &req).await.status, 200);
}

/// A tenant whose tenant-check option is misspelt: accepting it would switch the check off.
const MISSPELT: &str = "[[tenant]]\nprovider = \"stripe\"\ntenant = \"t1\"\nsecrets = [\"whsec_new\"]\noptions = { acount = \"acct_1\" }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_parameter_is_refused_at_start_and_a_reload_keeps_the_last_good() {
    let sdk = moto::shared().sdk_config().await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    let name = format!("/einmal/{}/tenants", moto::unique_name("cfg"));
    ssm.put_parameter()
        .name(&name)
        .value(MISSPELT)
        .r#type(aws_sdk_ssm::types::ParameterType::SecureString)
        .overwrite(true)
        .send()
        .await
        .expect("put parameter");
    let loader = Arc::new(SsmConfigLoader {
        client: ssm,
        name: name.clone(),
        scope: ConfigScope::Whole,
    });
    // What a function's init does: an invalid configuration is an error, naming the
    // parameter, the line and the nearest option.
    let err = loader.load().await.unwrap_err();
    assert!(err.contains(&name), "{err}");
    assert!(
        err.contains("line 5: tenant stripe/t1: unknown option `acount` for provider stripe (did you mean `account`?)"),
        "{err}"
    );
    // A running function reloading it keeps the last good configuration.
    let initial = Config::from_toml(&toml(&["whsec_kept"])).unwrap();
    let source = ConfigSource::refreshing(initial.clone(), loader, Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Default::default()).unwrap());
    let ingest = Ingestor::from_source(source, store.clone(), store.clone());
    let req = signed(&initial, "stripe", "t1", "", &stripe_body("evt_k2", 10));
    assert_eq!(ingest.ingest("stripe", "t1", &req).await.status, 200);
}
