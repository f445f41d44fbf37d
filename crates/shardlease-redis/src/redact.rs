//! Keeping the Redis password out of every error, log line and `Debug` output.
//!
//! The facade crate has its own `redact_url`, but backends cannot depend on the facade (it
//! depends on them), so this small copy lives here. Besides rewriting URLs, a [`Redactor`]
//! scrubs the password from any text (a driver error message, say) before it leaves the crate.

use url::Url;

/// What replaces a password.
const MASK: &str = "***";

/// `url` with any password replaced by `***`. A string that does not parse is replaced whole, as
/// it may hold a password in a shape we cannot find.
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                // Only fails for URLs that cannot have credentials, which have no password.
                let _ = u.set_password(Some(MASK));
            }
            u.to_string()
        }
        Err(_) => "<unparseable URL>".to_owned(),
    }
}

/// Removes known secrets from text.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    /// The password as written in the URL and percent-decoded (when they differ).
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for the password of `url` (if any).
    pub(crate) fn for_url(url: &Url) -> Self {
        let mut secrets = Vec::new();
        if let Some(raw) = url.password().filter(|p| !p.is_empty()) {
            secrets.push(raw.to_owned());
            let decoded = percent_decode(raw);
            if decoded != raw {
                secrets.push(decoded);
            }
        }
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    /// `text` with every secret replaced by `***`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), MASK);
            }
        }
        out
    }

    /// Whether `text` contains a secret.
    pub(crate) fn leaks(&self, text: &str) -> bool {
        self.secrets.iter().any(|s| text.contains(s.as_str()))
    }
}

/// Decodes `%XX` escapes; anything malformed is kept as it is.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("rediss://:pw@h/"), "rediss://:***@h/");
        assert_eq!(redact_url("redis://h:6379/"), "redis://h:6379/");
        assert_eq!(redact_url("::nope pw"), "<unparseable URL>");
    }

    #[test]
    fn text_loses_raw_and_decoded_passwords() {
        let url = Url::parse("redis://:p%40ss%25word@h/").unwrap();
        let r = Redactor::for_url(&url);
        assert_eq!(r.scrub("auth p@ss%word failed"), "auth *** failed");
        assert_eq!(r.scrub("url had p%40ss%25word"), "url had ***");
        assert!(r.leaks("x p@ss%word"));
        assert!(!r.leaks("nothing here"));
        let none = Redactor::for_url(&Url::parse("redis://h/").unwrap());
        assert_eq!(none.scrub("as is"), "as is");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
