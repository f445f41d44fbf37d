//! Keeping AWS keys out of every error, log line and `Debug` output.
//!
//! Keys reach the store in two ways: given to the builder (or in a `dynamodb://` URL, for
//! emulators), or found by the SDK's default credential chain. The SDK never prints the latter
//! (its `Credentials` redact themselves); the former pass through this crate, so a [`Redactor`]
//! built from them (core's, shared with every backend) scrubs any text (an SDK error message, say)
//! before it leaves the crate.

use url::Url;

pub(crate) use shardlease_core::redact::MASK;

/// `url` with any user name (access key id) and password (secret key) replaced by `***`. A
/// string that does not parse is replaced whole, as it may hold a key in a shape we cannot find.
pub fn redact_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            if !u.username().is_empty() {
                let _ = u.set_username(MASK);
            }
            if u.password().is_some() {
                let _ = u.set_password(Some(MASK));
            }
            redact_query(&mut u);
            u.to_string()
        }
        Err(_) => "<unparseable URL>".to_owned(),
    }
}

/// Query parameters that carry a secret, masked in [`redact_url`].
const SECRET_PARAMS: &[&str] = &["secret_access_key", "access_key_id", "session_token"];

fn redact_query(u: &mut Url) {
    if !u.query_pairs().any(|(k, _)| SECRET_PARAMS.contains(&k.as_ref())) {
        return;
    }
    let pairs: Vec<(String, String)> = u
        .query_pairs()
        .map(|(k, v)| {
            let v =
                if SECRET_PARAMS.contains(&k.as_ref()) { MASK.to_owned() } else { v.into_owned() };
            (k.into_owned(), v)
        })
        .collect();
    u.query_pairs_mut().clear().extend_pairs(pairs);
}

pub(crate) use shardlease_core::redact::Redactor;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_keys() {
        assert_eq!(
            redact_url("dynamodb://AKIDEXAMPLE:wJalr%2Fsecret@leases?region=eu-west-1"),
            "dynamodb://***:***@leases?region=eu-west-1"
        );
        assert_eq!(
            redact_url("dynamodb://t?session_token=tok&region=r"),
            "dynamodb://t?session_token=***&region=r"
        );
        assert_eq!(redact_url("dynamodb://leases"), "dynamodb://leases");
        assert_eq!(redact_url("::nope secret"), "<unparseable URL>");
    }

    #[test]
    fn text_loses_every_secret() {
        let r = Redactor::new(["AKID", "AKIDSECRET", ""]);
        assert_eq!(r.scrub("key AKIDSECRET and AKID"), "key *** and ***");
        assert!(r.leaks("x AKID"));
        assert!(!Redactor::default().leaks("AKID"));
    }
}
