//! Opt-in extension cases: checks that every store of a kind shares but the conformance suite
//! cannot run on its own, because they need raw access to the backend (writing garbage under a
//! key, restarting the server) or a store-specific URL. A store's test implements the small hook
//! trait of a module and runs its cases with one line each; the assertions live here once.
//!
//! - [`corrupt`]: records that do not decode are reported per record ([`CorruptRecords`]);
//! - [`redaction`]: a password in a store URL never shows ([`SecretUrl`]);
//! - [`restart`]: a server restart loses and regresses no checkpoint ([`RestartServer`]).

pub mod corrupt;
pub mod redaction;
pub mod restart;

pub use corrupt::{CorruptRecords, Corruption};
pub use redaction::SecretUrl;
pub use restart::RestartServer;
