//! `einmal orders show` and `einmal inventory show|set`: read (and seed) business state.

use std::process::ExitCode;

use clap::Subcommand;
use einmal::domain::reference::Sku;
use einmal::domain::state::{CommitOne, CommitOutcome, StateKey, StateRecord, StateWrite};

use crate::store::StoreArgs;
use einmal_cli::error::CliError;

#[derive(Debug, Subcommand)]
pub enum OrdersCommand {
    /// One order with its payment status, invoices, refunds, shipments and notifications.
    Show {
        #[arg(long)]
        tenant: String,
        order_id: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum InventoryCommand {
    /// Stock of one SKU.
    Show {
        #[arg(long)]
        tenant: String,
        sku: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Set the stock of a SKU (creates it). Orders for unknown SKUs are dead-lettered.
    Set {
        #[arg(long)]
        tenant: String,
        sku: String,
        #[arg(long, allow_negative_numbers = true)]
        on_hand: i64,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

fn record_json(record: &StateRecord) -> serde_json::Value {
    let mut value = record.data.clone();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("version".into(), record.version.into());
        obj.insert(
            "applied_effects".into(),
            record.applied.iter().cloned().collect::<Vec<_>>().into(),
        );
    }
    value
}

async fn show(
    store: &StoreArgs,
    key: StateKey,
    json: bool,
    what: &str,
) -> Result<ExitCode, CliError> {
    let state = store.open_state().await?;
    let records = state
        .load(std::slice::from_ref(&key))
        .await
        .map_err(|e| e.to_string())?;
    let Some(record) = records.into_iter().next().filter(StateRecord::exists) else {
        return Err(CliError::NotFound(format!(
            "no {what} {} for tenant {}",
            key.id, key.tenant
        )));
    };
    let value = record_json(&record);
    // Stored data, from webhooks: what JSON leaves raw is escaped (`einmal::text`).
    let text = if json {
        serde_json::to_string_pretty(&value)
    } else {
        serde_json::to_string(&value)
    }
    .map_err(|e| e.to_string())?;
    println!("{}", einmal::text::json_terminal_safe(&text));
    Ok(ExitCode::SUCCESS)
}

pub async fn run_orders(command: OrdersCommand) -> Result<ExitCode, CliError> {
    match command {
        OrdersCommand::Show {
            tenant,
            order_id,
            json,
            store,
        } => {
            show(
                &store,
                StateKey::new(tenant, "order", order_id),
                json,
                "order",
            )
            .await
        }
    }
}

pub async fn run_inventory(command: InventoryCommand) -> Result<ExitCode, CliError> {
    match command {
        InventoryCommand::Show {
            tenant,
            sku,
            json,
            store,
        } => show(&store, StateKey::new(tenant, "sku", sku), json, "SKU").await,
        InventoryCommand::Set {
            tenant,
            sku,
            on_hand,
            json,
            store,
        } => {
            let state = store.open_state().await?;
            let key = StateKey::new(tenant, "sku", sku.clone());
            // An operator write, guarded like any other: retry if a processor moved stock meanwhile.
            for _ in 0..10 {
                let current = state
                    .load(std::slice::from_ref(&key))
                    .await
                    .map_err(|e| e.to_string())?
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| StateRecord::missing(key.clone()));
                let mut record = current.clone();
                record.version = current.version + 1;
                let data = Sku {
                    sku: sku.clone(),
                    on_hand,
                };
                record.data = serde_json::to_value(&data).map_err(|e| e.to_string())?;
                let write = StateWrite {
                    record,
                    expected_version: current.version,
                };
                match state.commit(&[write]).await.map_err(|e| e.to_string())? {
                    CommitOutcome::Committed => {
                        if json {
                            let text = serde_json::json!({"sku": sku, "on_hand": on_hand});
                            println!("{}", einmal::text::json_terminal_safe(&text.to_string()));
                        } else {
                            let sku = einmal::text::terminal_safe(&sku);
                            println!("{sku}: on_hand = {on_hand}");
                        }
                        return Ok(ExitCode::SUCCESS);
                    }
                    CommitOutcome::Conflict => continue,
                }
            }
            Err(format!("could not set {sku}: the record kept changing").into())
        }
    }
}
