//! `shardlease import-kcl`: switching from the Java KCL or vmware-go-kcl without reprocessing.
//! It reads the KCL's DynamoDB lease table, maps every lease to an unowned shardlease lease at
//! the exact checkpoint (sub-sequence included) with its parents, `SHARD_END` leases to finished
//! ones, and writes them into the target store through the store contract's create-if-absent,
//! the same for every store. It refuses while the KCL fleet still runs (its leases' renewals
//! move between two scans `--observe-ms` apart) and a target namespace that holds other leases
//! (unless `--merge`, which never overwrites a lease that differs). A second run finds every
//! lease in place and writes nothing. docs/migrating-from-kcl.md walks through a switch.

mod plan;
mod schema;
mod source;

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use shardlease::store::{transition, CreateOutcome, LeaseStore};
use shardlease::Position;

use crate::error::CliError;
use crate::output::{emit, print_json};
use crate::store_url::Target;
use plan::{Action, Entry, Plan};
use schema::Row;
pub use schema::Schema;
use source::TableRef;

/// How long the import watches the KCL table by default: longer than the KCL's default
/// failover time (10 s), within which a live worker must renew every lease it holds.
pub const DEFAULT_OBSERVE_MS: u64 = 12_000;

/// The command line of `import-kcl`.
#[derive(clap::Args, Debug)]
pub struct ImportKclArgs {
    /// The KCL lease table (the KCL application name, unless configured otherwise).
    #[arg(long)]
    table: String,
    /// The table's AWS region (else AWS_REGION or the profile's).
    #[arg(long)]
    region: Option<String>,
    /// The DynamoDB endpoint, for emulators (else AWS_ENDPOINT_URL_DYNAMODB or AWS).
    #[arg(long)]
    endpoint_url: Option<String>,
    /// The table's schema; detected from the rows' key attribute when not given.
    #[arg(long, value_enum)]
    schema: Option<Schema>,
    /// Import the multi-stream leases (`account:stream:creationEpoch:shardId`) of this stream;
    /// without it, multi-stream leases are reported and skipped.
    #[arg(long)]
    stream: Option<String>,
    /// Where leases without a recorded position start: the KCL application's
    /// initialPositionInStream (TRIM_HORIZON, LATEST or AT_TIMESTAMP(MILLIS)). Needed for Java
    /// leases at the AT_TIMESTAMP sentinel and vmware-go-kcl leases never checkpointed.
    #[arg(long, value_name = "POSITION")]
    initial_position: Option<String>,
    /// Print the plan and write nothing (the exit status is the one the import would have).
    #[arg(long)]
    dry_run: bool,
    /// Import even though the KCL fleet looks alive (and without watching it).
    #[arg(long)]
    force: bool,
    /// Import into a namespace that already holds leases: leases equal to the import are left,
    /// different ones are reported as conflicts (exit 5) and never overwritten.
    #[arg(long)]
    merge: bool,
}

/// The fleet's liveness as the import saw it.
#[derive(Debug, Serialize)]
struct Fleet {
    /// `stopped`, `alive` or `not observed` (--force).
    status: &'static str,
    /// What showed it alive.
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<String>,
    /// The observation window in milliseconds (0 with --force).
    window_ms: u64,
}

/// The whole answer, for `--json`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    table: &'a str,
    schema: Schema,
    namespace: &'a str,
    store: &'a str,
    dry_run: bool,
    fleet: Fleet,
    leases: &'a [Entry],
    target_other_leases: &'a [String],
    summary: Summary,
}

#[derive(Debug, Serialize)]
struct Summary {
    create: usize,
    created: usize,
    unchanged: usize,
    conflict: usize,
    skipped: usize,
    error: usize,
}

/// Runs `import-kcl`.
pub async fn run(
    target: &Target,
    args: &ImportKclArgs,
    observe: Duration,
    json: bool,
) -> Result<ExitCode, CliError> {
    let initial = args.initial_position.as_deref().map(start_position).transpose()?;
    let table = TableRef {
        table: args.table.clone(),
        region: args.region.clone(),
        endpoint_url: args.endpoint_url.clone(),
    };
    let client = source::client(&table).await?;
    let first = source::scan(&client, &table).await?;
    let window_ms = u64::try_from(observe.as_millis()).unwrap_or(u64::MAX);
    let items = if args.force {
        first.clone()
    } else {
        tokio::time::sleep(observe).await;
        source::scan(&client, &table).await?
    };
    let schema = match args.schema {
        Some(s) => s,
        None => schema::detect(&items).map_err(CliError::Usage)?.ok_or_else(|| {
            CliError::Usage(format!(
                "table {} holds no KCL lease (no row has a `leaseKey` or a `ShardID`)",
                args.table
            ))
        })?,
    };
    let fleet = if args.force {
        Fleet { status: "not observed", evidence: None, window_ms: 0 }
    } else {
        match source::movement(schema, &first, &items) {
            Some(evidence) => Fleet { status: "alive", evidence: Some(evidence), window_ms },
            None => Fleet { status: "stopped", evidence: None, window_ms },
        }
    };
    let rows: Vec<Row> = items.iter().map(|i| schema::read_row(schema, i)).collect();
    if let Some(stream) = &args.stream {
        let found = rows
            .iter()
            .any(|r| matches!(r, Row::Lease(l) if l.stream.as_deref() == Some(stream.as_str())));
        if !found {
            return Err(CliError::Usage(format!(
                "table {} holds no multi-stream lease of stream {stream}",
                args.table
            )));
        }
    }
    let listing = target.store.list_leases().await.map_err(CliError::Store)?;
    let corrupt: BTreeSet<String> = listing.corrupt.iter().map(|c| c.key.clone()).collect();
    let inputs = plan::Inputs {
        stream: args.stream.as_deref(),
        initial: initial.as_ref(),
        target: &listing.items,
        target_corrupt: &corrupt,
        epoch: transition::creation_epoch(shardlease::store::now_millis()),
    };
    let mut plan = plan::build(rows, &inputs);

    // Decide before writing anything: unmappable rows, a live fleet, a foreign target.
    let refusal = refusal(&plan, &fleet, args, target, schema, &table.table);
    if refusal.is_none() && !args.dry_run {
        apply(&*target.store, &mut plan).await?;
    }
    let summary = Summary {
        create: plan.count(Action::Create),
        created: plan.count(Action::Created),
        unchanged: plan.count(Action::Unchanged),
        conflict: plan.count(Action::Conflict),
        skipped: plan.count(Action::Skipped),
        error: plan.count(Action::Error),
    };
    if json {
        print_json(&Report {
            table: &table.table,
            schema,
            namespace: &target.namespace,
            store: &target.redacted_url,
            dry_run: args.dry_run,
            fleet,
            leases: &plan.entries,
            target_other_leases: &plan.foreign,
            summary,
        })?;
    } else {
        emit(&plan::table(&plan));
        let fleet_line = match (&fleet.evidence, fleet.status) {
            (Some(e), _) => format!("KCL fleet: alive ({e} within {} ms)", fleet.window_ms),
            (None, "stopped") => {
                format!("KCL fleet: stopped (no lease renewed within {} ms)", fleet.window_ms)
            }
            (None, _) => "KCL fleet: not observed (--force)".to_owned(),
        };
        let verb = if args.dry_run { "would create" } else { "created" };
        let made = if args.dry_run { summary.create } else { summary.created };
        emit(&format!(
            "{fleet_line}\ntable {} ({schema}) -> namespace {} of {}: {verb} {made}, unchanged \
             {}, conflict {}, skipped {}, error {}{}",
            table.table,
            target.namespace,
            target.redacted_url,
            summary.unchanged,
            summary.conflict,
            summary.skipped,
            summary.error,
            if args.dry_run { " (dry run: nothing written)" } else { "" }
        ));
    }
    if let Some(r) = refusal {
        return Err(r);
    }
    if plan.count(Action::Conflict) > 0 {
        return Err(CliError::Conflict(format!(
            "{} lease(s) in namespace {} differ from the KCL table and were left as they are \
             (see the conflict rows); nothing of them was overwritten",
            plan.count(Action::Conflict),
            target.namespace
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--initial-position`: a starting position, not a checkpoint.
fn start_position(s: &str) -> Result<Position, CliError> {
    match crate::write::parse_position(s)? {
        p @ (Position::TrimHorizon | Position::Latest | Position::AtTimestamp { .. }) => Ok(p),
        other => Err(CliError::Usage(format!(
            "--initial-position {other} is not a starting position (expected TRIM_HORIZON, \
             LATEST or AT_TIMESTAMP(MILLIS))"
        ))),
    }
}

/// Why the import must not write, if it must not: rows it cannot map, a live KCL fleet, or a
/// target namespace holding leases the import would not write as they are (without --merge).
fn refusal(
    plan: &Plan,
    fleet: &Fleet,
    args: &ImportKclArgs,
    target: &Target,
    schema: Schema,
    table: &str,
) -> Option<CliError> {
    let errors = plan.count(Action::Error);
    if errors > 0 {
        return Some(CliError::Usage(format!(
            "{errors} row(s) of table {table} cannot be imported (see the error rows); nothing \
             was written: a lease left out would be created by the fleet at its initial \
             position, reprocessing or skipping records"
        )));
    }
    if let Some(e) = &fleet.evidence {
        return Some(CliError::Refused(format!(
            "refusing to import from table {table}: the KCL fleet is alive ({e} within {} ms; \
             a live worker renews its leases, moving their {}). Stop every KCL worker first, so \
             no checkpoint is written after the import; --force imports anyway, and records a \
             KCL worker processes after the import are processed again by shardlease",
            fleet.window_ms,
            schema.renewal_attribute()
        )));
    }
    if !args.merge {
        let differing = plan.count(Action::Conflict);
        if !plan.foreign.is_empty() || differing > 0 {
            return Some(CliError::Refused(format!(
                "refusing to import into namespace {} of {}: it already holds {} lease(s) that \
                 this import would not write as they are ({} other key(s), {differing} \
                 differing). Import into an empty namespace, or re-run with --merge to add the \
                 missing leases and leave the others (differing ones are reported, never \
                 overwritten)",
                target.namespace,
                target.redacted_url,
                plan.foreign.len() + differing,
                plan.foreign.len()
            )));
        }
    }
    None
}

/// Creates the planned leases, parents first. A lease that appeared meanwhile is compared
/// instead: the same one is `unchanged`, another a `conflict`.
async fn apply(store: &dyn LeaseStore, plan: &mut Plan) -> Result<(), CliError> {
    for e in plan.entries.iter_mut().filter(|e| e.action == Action::Create) {
        let Some(lease) = &e.lease else { continue };
        match store.create_lease(lease).await.map_err(CliError::Store)? {
            CreateOutcome::Created(_) => e.action = Action::Created,
            CreateOutcome::AlreadyExists => {
                let now = store.get_lease(&lease.key).await.map_err(CliError::Store)?;
                match now {
                    Some(v) if plan::same_lease(&v.lease, lease) => {
                        e.action = Action::Unchanged;
                        e.note = "written meanwhile by someone else, the same".into();
                    }
                    _ => {
                        e.action = Action::Conflict;
                        e.note =
                            "written meanwhile by someone else, differently; left as it is".into();
                    }
                }
            }
        }
    }
    Ok(())
}
