//! Small string newtypes so a lease key, a worker id and a namespace cannot be mixed up.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The namespace used when none is given (a store URL without `?namespace=`): the one
/// definition every store and the facade share.
pub const DEFAULT_NAMESPACE: &str = "default";

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a string.
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }
            /// The string inside.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", self.0)
            }
        }
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(s)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// The key of a lease: the shard id, or `stream/shard` when a worker consumes several streams.
    LeaseKey
);
string_id!(
    /// The identity of a worker. Must be unique among the live workers of a namespace.
    WorkerId
);
string_id!(
    /// The application name; every lease and worker record lives in one namespace.
    Namespace
);

impl WorkerId {
    /// A fresh id: `host-pid-random`, unique enough for a fleet.
    pub fn generate() -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned());
        let suffix: u32 = rand::random();
        WorkerId(format!("{host}-{}-{suffix:08x}", std::process::id()))
    }
}

/// Checks a namespace or worker id: non-empty, at most 200 bytes, no control characters.
pub(crate) fn validate_name(what: &str, s: &str) -> Result<()> {
    if s.is_empty() {
        return Err(Error::Config(format!("{what} must not be empty")));
    }
    if s.len() > 200 {
        return Err(Error::Config(format!("{what} must be at most 200 bytes, got {}", s.len())));
    }
    if s.chars().any(char::is_control) {
        return Err(Error::Config(format!("{what} must not contain control characters")));
    }
    Ok(())
}
