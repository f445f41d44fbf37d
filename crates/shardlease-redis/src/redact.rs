//! Keeping the Redis password out of every error, log line and `Debug` output.
//!
//! The facade crate has its own `redact_url`, but backends cannot depend on the facade (it
//! depends on them), so this small copy lives here. Besides rewriting URLs, a [`Redactor`]
//! scrubs the password from any text (a driver error message, say) before it leaves the crate.

use url::Url;

use shardlease_core::redact::MASK;

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

pub(crate) use shardlease_core::redact::Redactor;

/// A redactor for the password of `url` (if any), as written and percent-decoded.
pub(crate) fn for_url(url: &Url) -> Redactor {
    match url.password().filter(|p| !p.is_empty()) {
        Some(raw) => Redactor::new([raw.to_owned(), percent_decode(raw)]),
        None => Redactor::default(),
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
        let r = for_url(&url);
        assert_eq!(r.scrub("auth p@ss%word failed"), "auth *** failed");
        assert_eq!(r.scrub("url had p%40ss%25word"), "url had ***");
        assert!(r.leaks("x p@ss%word"));
        assert!(!r.leaks("nothing here"));
        let none = for_url(&Url::parse("redis://h/").unwrap());
        assert_eq!(none.scrub("as is"), "as is");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
