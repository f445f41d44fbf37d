//! Keeping secrets (passwords, access keys) out of errors, logs and `Debug` output.
//!
//! Every backend that is handed a secret scrubs driver and SDK messages before they leave it.
//! The scrubbing is the same for all of them, so it lives here: a backend builds a [`Redactor`]
//! from its secrets (how it finds them, in a URL or a builder, is its own business) and maps a
//! driver failure with [`Redactor::backend_error`].

use crate::error::Error;

/// What replaces a secret.
pub const MASK: &str = "***";

/// Removes known secrets from text.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Longest first, so a secret containing another is replaced whole.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

/// A failure whose text had to be scrubbed of a secret, standing in for the original source.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RedactedError(String);

impl Redactor {
    /// A redactor for these secrets (empty ones are ignored).
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Self {
        let mut secrets: Vec<String> =
            secrets.into_iter().map(|s| s.as_ref().to_owned()).filter(|s| !s.is_empty()).collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets }
    }

    /// `text` with every secret replaced by [`MASK`].
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), MASK);
            }
        }
        out
    }

    /// Whether `text` contains a secret.
    pub fn leaks(&self, text: &str) -> bool {
        self.secrets.iter().any(|s| text.contains(s.as_str()))
    }

    /// `Error::Backend` for a driver failure: the message is `{context}: {display}` scrubbed
    /// (`display` is how the driver's error reads, which some SDKs spell out in a wrapper), and
    /// `source` is kept unless its text or `Debug` holds a secret, in which case a scrubbed copy
    /// of `display` takes its place.
    pub fn backend_error<E>(
        &self,
        retryable: bool,
        context: &str,
        display: &str,
        source: E,
    ) -> Error
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let message = format!("{context}: {}", self.scrub(display));
        if self.leaks(display) || self.leaks(&format!("{source:?}")) {
            Error::backend(retryable, message, RedactedError(self.scrub(display)))
        } else {
            Error::backend(retryable, message, source)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Driver(&'static str);

    impl std::fmt::Display for Driver {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Driver {}

    #[test]
    fn every_secret_is_scrubbed_longest_first() {
        let r = Redactor::new(["AKID", "AKIDSECRET", ""]);
        assert_eq!(r.scrub("key AKIDSECRET and AKID"), "key *** and ***");
        assert!(r.leaks("x AKID"));
        assert!(!Redactor::default().leaks("AKID"));
        assert_eq!(format!("{r:?}"), "Redactor(2 secrets)");
    }

    #[test]
    fn a_leaking_source_is_replaced_by_its_scrubbed_text() {
        let r = Redactor::new(["pw"]);
        let e = r.backend_error(true, "redis: get", "auth pw failed", Driver("auth pw failed"));
        let shown = format!("{e} / {e:?}");
        assert!(!shown.contains("pw"), "{shown}");
        assert!(e.is_retryable());
        let clean = r.backend_error(false, "redis: get", "boom", Driver("boom"));
        assert!(format!("{clean:?}").contains("Driver"), "{clean:?}");
    }
}
