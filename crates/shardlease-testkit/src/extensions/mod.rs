//! Opt-in extension cases: checks that every store of a kind shares but the conformance suite
//! cannot run on its own, because they need raw access to the backend (writing garbage under a
//! key, restarting the server) or a store-specific URL. A store's test implements the small hook
//! trait of a module and runs its cases with one line each; the assertions live here once.
//!
//! - [`corrupt`]: records that do not decode are reported per record ([`CorruptRecords`]);
//! - [`redaction`]: a password in a store URL never shows ([`SecretUrl`]);
//! - [`restart`]: a server restart loses and regresses no checkpoint ([`RestartServer`]);
//! - [`tls`]: a trusted certificate connects, an unknown CA and a wrong host name are refused,
//!   and the password shows nowhere ([`TlsUrls`]).

pub mod corrupt;
pub mod redaction;
pub mod restart;
pub mod tls;

pub use corrupt::{CorruptRecords, Corruption};
pub use redaction::SecretUrl;
pub use restart::RestartServer;
pub use tls::{TlsEnv, TlsUrls};
