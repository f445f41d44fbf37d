//! `shardlease import-kcl`: switching from the Java KCL or vmware-go-kcl without reprocessing.
//! It reads the KCL's DynamoDB lease table, maps every lease to an unowned shardlease lease at
//! the exact checkpoint (sub-sequence included) with its parents, `SHARD_END` leases to finished
//! ones, and writes them into the target store through the store contract's create-if-absent,
//! the same for every store. It refuses while the KCL fleet still runs (its leases' renewals
//! move between two scans `--observe-ms` apart) and a target namespace that holds other leases
//! (unless `--merge`, which never overwrites a lease that differs). A second run finds every
//! lease in place and writes nothing. docs/migrating-from-kcl.md walks through a switch.
//!
//! A KCL multi-stream table is imported for either kind of shardlease fleet: `--stream S` writes
//! the leases of stream S under their bare shard ids (a single-stream fleet), `--multi-stream`
//! writes every stream's leases (or those of the `--stream`s named) under `stream/shardId`, the
//! keys a multi-stream source reads (core's `qualify`).

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
use plan::{Action, Entry, Plan, Streams};
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
    /// Import the multi-stream leases (`account:stream:creationEpoch:shardId`) of this stream:
    /// under their bare shard ids for a single-stream fleet; with --multi-stream, repeatable,
    /// to import only the streams named. Without it (and without --multi-stream), multi-stream
    /// leases are reported and skipped.
    #[arg(long, value_name = "STREAM")]
    stream: Vec<String>,
    /// Import the multi-stream leases for a shardlease multi-stream fleet: each under
    /// `stream/shardId` (the key a multi-stream source gives it), parents likewise, for every
    /// stream in the table or only the --stream ones. Single-stream leases are skipped.
    #[arg(long)]
    multi_stream: bool,
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
    /// Whether leases are keyed `stream/shardId` (--multi-stream).
    multi_stream: bool,
    /// The streams whose leases were imported.
    streams: Vec<String>,
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
    let streams = streams(args)?;
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
    let in_table: BTreeSet<&str> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Lease(l) => l.stream.as_deref(),
            _ => None,
        })
        .collect();
    if let Some(missing) = args.stream.iter().find(|s| !in_table.contains(s.as_str())) {
        return Err(CliError::Usage(format!(
            "table {} holds no multi-stream lease of stream {missing}",
            args.table
        )));
    }
    if args.multi_stream && in_table.is_empty() {
        return Err(CliError::Usage(format!(
            "table {} holds no multi-stream lease (key account:stream:creationEpoch:shardId): \
             import it without --multi-stream",
            args.table
        )));
    }
    let imported: Vec<String> = match streams {
        Streams::Multi([]) => in_table.iter().map(|s| (*s).to_owned()).collect(),
        Streams::Multi(named) => {
            named.iter().cloned().collect::<BTreeSet<String>>().into_iter().collect()
        }
        Streams::Single(one) => one.map(str::to_owned).into_iter().collect(),
    };
    let listing = target.store.list_leases().await.map_err(CliError::Store)?;
    let corrupt: BTreeSet<String> = listing.corrupt.iter().map(|c| c.key.clone()).collect();
    let inputs = plan::Inputs {
        streams,
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
            multi_stream: args.multi_stream,
            streams: imported,
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
        let keys = if args.multi_stream {
            format!(" as stream/shardId keys of {}", imported.join(", "))
        } else {
            String::new()
        };
        let made = if args.dry_run { summary.create } else { summary.created };
        emit(&format!(
            "{fleet_line}\ntable {} ({schema}) -> namespace {} of {}{keys}: {verb} {made}, \
             unchanged {}, conflict {}, skipped {}, error {}{}",
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

/// `--stream` and `--multi-stream`: which leases the import writes, under which keys. Without
/// --multi-stream one stream at most (its leases get bare shard ids, so two streams would
/// collide); with it, each name must be one a multi-stream lease key can carry.
fn streams(args: &ImportKclArgs) -> Result<Streams<'_>, CliError> {
    if args.multi_stream {
        for s in &args.stream {
            shardlease::validate_stream_name(s).map_err(|e| {
                CliError::Usage(match e {
                    shardlease::Error::Config(m) => format!("--stream: {m}"),
                    other => format!("--stream: {other}"),
                })
            })?;
        }
        return Ok(Streams::Multi(&args.stream));
    }
    match args.stream.as_slice() {
        [] => Ok(Streams::Single(None)),
        [one] => Ok(Streams::Single(Some(one.as_str()))),
        many => Err(CliError::Usage(format!(
            "--stream is given {} times: without --multi-stream the leases of one stream are \
             imported, under bare shard ids (two streams' shard ids would collide); pass \
             --multi-stream to import several streams under stream/shardId keys",
            many.len()
        ))),
    }
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
