//! # shardlease-multilang
//!
//! A KCL MultiLang daemon without the JVM: it reads a KCL application's properties file and runs
//! its record processor program (amazon-kclpy, aws-kcl, or anything speaking the MultiLang
//! protocol) unchanged, one child process per shard lease, the leases kept in any shardlease
//! store. See `docs/multilang.md` in the repository.
//!
//! - [`settings`] maps the properties file ([`properties`] reads it);
//! - [`protocol`] is the wire format, [`child`] a child process, [`exchange`] one call and
//!   response with checkpoints served on the way;
//! - [`processor`] is the shardlease record processor driving a child, [`daemon`] the worker;
//! - [`listener`] serves `/metrics` and `/health` when `shardlease.metricsAddress` is set.
//!
//! The binary `shardlease-multilang --properties app.properties` is what an application runs
//! instead of the Java daemon. Reading a properties file as the daemon does:
//!
//! ```
//! use shardlease_multilang::Settings;
//!
//! let settings = Settings::from_text(
//!     "executableName = python3 app.py\n\
//!      streamName = orders\n\
//!      applicationName = orders-app\n\
//!      initialPositionInStream = TRIM_HORIZON\n\
//!      shardlease.store = sqlite://orders.db?mode=rwc\n\
//!      metricsLevel = NONE\n",
//! )?;
//! assert_eq!(settings.namespace, "orders-app");
//! assert_eq!(settings.child.command, ["python3", "app.py"]);
//! // Keys with no shardlease meaning are listed at startup, never silently dropped.
//! assert!(settings.ignored.iter().any(|k| k.key == "metricsLevel"));
//! # Ok::<(), shardlease_multilang::MultiLangError>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod child;
pub mod daemon;
pub mod error;
pub mod exchange;
pub mod listener;
pub mod processor;
pub mod properties;
pub mod protocol;
pub mod settings;
pub mod telemetry;

pub use daemon::{run, run_with, run_with_options, RunOptions, RunReport};
pub use error::{MultiLangError, Result};
pub use processor::{ChildStats, MultiLangFactory};
pub use settings::Settings;
