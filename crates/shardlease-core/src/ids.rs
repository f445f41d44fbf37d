//! Small string newtypes so a lease key, a worker id and a namespace cannot be mixed up.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The namespace used when none is given (a store URL without `?namespace=`): the one
/// definition every store and the facade share.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A string newtype with `as_str`, `Display`, `Debug` and `AsRef<str>`; the constructors are the
/// caller's (see [`unchecked_from`] for the ones that accept any string).
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
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
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

/// `From<&str>`, `From<String>` and `Deserialize` for a newtype any string is a valid value of.
macro_rules! unchecked_from {
    ($name:ident) => {
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
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                String::deserialize(d).map(Self)
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
    ///
    /// One rule for every store: 1 to [`Namespace::MAX_BYTES`] bytes, no control characters.
    /// Every way to make one checks it: [`Namespace::new`], `TryFrom<&str>`, `TryFrom<String>`,
    /// [`str::parse`] and deserializing; there is no unchecked constructor. A store whose native
    /// limit is stricter adds its own check on top and says so where it is built.
    ///
    /// ```
    /// use shardlease_core::Namespace;
    /// let ns: Namespace = "orders".parse()?;
    /// assert_eq!(ns.as_str(), "orders");
    /// assert!(Namespace::try_from("").is_err());
    /// # Ok::<(), shardlease_core::Error>(())
    /// ```
    Namespace
);
unchecked_from!(LeaseKey);
unchecked_from!(WorkerId);

impl LeaseKey {
    /// Wraps a string.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

impl WorkerId {
    /// Wraps a string.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
}

impl Namespace {
    /// The longest namespace, in bytes (UTF-8).
    pub const MAX_BYTES: usize = 200;

    /// A checked namespace: `Error::Config` unless it has 1 to [`Namespace::MAX_BYTES`] bytes
    /// and no control characters.
    pub fn new(s: impl Into<String>) -> Result<Self> {
        let s = s.into();
        validate_name("namespace", &s)?;
        Ok(Namespace(s))
    }
}

impl Default for Namespace {
    /// [`DEFAULT_NAMESPACE`] (which follows the rule; a test checks it).
    fn default() -> Self {
        Namespace(DEFAULT_NAMESPACE.to_owned())
    }
}

impl TryFrom<&str> for Namespace {
    type Error = Error;
    /// [`Namespace::new`].
    fn try_from(s: &str) -> Result<Self> {
        Namespace::new(s)
    }
}

impl TryFrom<String> for Namespace {
    type Error = Error;
    /// [`Namespace::new`].
    fn try_from(s: String) -> Result<Self> {
        Namespace::new(s)
    }
}

impl std::str::FromStr for Namespace {
    type Err = Error;
    /// [`Namespace::new`].
    fn from_str(s: &str) -> Result<Self> {
        Namespace::new(s)
    }
}

impl<'de> Deserialize<'de> for Namespace {
    /// Checked like [`Namespace::new`]: a stored or sent namespace breaking the rule is an error.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Namespace::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl WorkerId {
    /// A fresh id: `host-pid-random`, unique enough for a fleet. The host is the machine's
    /// host name (asked of the system, not read from `$HOSTNAME`, which is often unset), at most
    /// 64 characters of it and no control characters, or `worker` when it has none.
    pub fn generate() -> Self {
        let suffix: u32 = rand::random();
        WorkerId(format!("{}-{}-{suffix:08x}", host_part(), std::process::id()))
    }
}

/// The host name as the first part of a generated worker id.
fn host_part() -> String {
    let host: String = gethostname::gethostname()
        .to_string_lossy()
        .chars()
        .filter(|c| !c.is_control())
        .take(64)
        .collect();
    if host.is_empty() {
        "worker".to_owned()
    } else {
        host
    }
}

/// Checks a namespace or worker id: non-empty, at most [`Namespace::MAX_BYTES`] bytes, no
/// control characters.
pub(crate) fn validate_name(what: &str, s: &str) -> Result<()> {
    if s.is_empty() {
        return Err(Error::Config(format!("{what} must not be empty")));
    }
    let max = Namespace::MAX_BYTES;
    if s.len() > max {
        return Err(Error::Config(format!("{what} must be at most {max} bytes, got {}", s.len())));
    }
    if s.chars().any(char::is_control) {
        return Err(Error::Config(format!("{what} must not contain control characters")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn generated_ids_start_with_the_host_name_and_are_valid() {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        let a = WorkerId::generate();
        let b = WorkerId::generate();
        assert_ne!(a, b);
        assert!(validate_name("worker id", a.as_str()).is_ok(), "{a}");
        let part = host_part();
        if host.is_empty() {
            assert_eq!(part, "worker");
        } else {
            assert!(!part.is_empty() && host.starts_with(&part), "{part} vs host {host}");
        }
        let pid = std::process::id();
        assert!(a.as_str().starts_with(&format!("{part}-{pid}-")), "{a}");
    }

    #[test]
    fn namespaces_follow_one_rule() {
        assert_eq!(Namespace::new("orders/eu é").unwrap().as_str(), "orders/eu é");
        assert_eq!(Namespace::new("x".repeat(200)).unwrap().as_str().len(), 200);
        for (bad, why) in [
            (String::new(), "must not be empty"),
            ("x".repeat(201), "at most 200 bytes, got 201"),
            ("é".repeat(101), "at most 200 bytes, got 202"),
            ("a\0b".to_owned(), "control characters"),
            ("a\nb".to_owned(), "control characters"),
        ] {
            for made in [
                Namespace::new(bad.clone()),
                Namespace::try_from(bad.as_str()),
                Namespace::try_from(bad.clone()),
                bad.parse(),
                serde_json::from_value(serde_json::Value::String(bad.clone()))
                    .map_err(|e| Error::Config(e.to_string())),
            ] {
                match made {
                    Err(Error::Config(m)) => assert!(m.contains(why), "{m}"),
                    other => panic!("expected a config error, got {other:?}"),
                }
            }
        }
        assert_eq!(Namespace::default(), Namespace::new(DEFAULT_NAMESPACE).unwrap());
        let ok: Namespace = serde_json::from_str("\"orders\"").unwrap();
        assert_eq!(
            (ok.as_str(), serde_json::to_string(&ok).unwrap().as_str()),
            ("orders", "\"orders\"")
        );
    }
}
