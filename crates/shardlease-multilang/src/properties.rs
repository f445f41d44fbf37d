//! Reading a Java `.properties` file, the format every KCL MultiLang application already has:
//! `key = value`, `key: value` or `key value`, `#` and `!` comments, a trailing backslash
//! continuing a line, and the usual escapes. Each entry keeps its line so an error can name it.

/// One `key = value` of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value, unescaped and trimmed of leading whitespace.
    pub value: String,
    /// The line the entry starts on (1-based).
    pub line: usize,
}

/// Parses the text of a properties file into its entries, in file order (a key given twice
/// appears twice; the last one wins when they are looked up).
pub fn parse(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, raw)) = lines.next() {
        let start = raw.trim_start();
        if start.is_empty() || start.starts_with('#') || start.starts_with('!') {
            continue;
        }
        // Join continuation lines: an odd number of trailing backslashes continues the line.
        let mut logical = start.to_owned();
        while ends_with_continuation(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let (key, value) = split_key_value(&logical);
        entries.push(Entry { key: unescape(&key), value: unescape(&value), line: index + 1 });
    }
    entries
}

fn ends_with_continuation(s: &str) -> bool {
    s.chars().rev().take_while(|c| *c == '\\').count() % 2 == 1
}

/// Splits at the first unescaped `=`, `:` or whitespace (whitespace around the separator is
/// part of it).
fn split_key_value(line: &str) -> (String, String) {
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    let mut key_end = chars.len();
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '=' | ':' => {
                key_end = i;
                break;
            }
            c if c.is_whitespace() => {
                key_end = i;
                break;
            }
            _ => i += 1,
        }
    }
    let key: String = chars[..key_end.min(chars.len())].iter().collect();
    let mut j = key_end;
    while j < chars.len() && chars[j].is_whitespace() {
        j += 1;
    }
    if j < chars.len() && (chars[j] == '=' || chars[j] == ':') {
        j += 1;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
    }
    let value: String = chars[j.min(chars.len())..].iter().collect();
    (key, value)
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                    Some(ch) => out.push(ch),
                    None => {
                        out.push_str("\\u");
                        out.push_str(&hex);
                    }
                }
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(text: &str) -> Vec<(String, String, usize)> {
        parse(text).into_iter().map(|e| (e.key, e.value, e.line)).collect()
    }

    #[test]
    fn separators_comments_and_continuations() {
        let text =
            "# comment\n! other\n\na = 1\nb:2\nc 3\n  d   =   x y  \ne = one \\\n    two\nf\n";
        assert_eq!(
            kv(text),
            vec![
                ("a".into(), "1".into(), 4),
                ("b".into(), "2".into(), 5),
                ("c".into(), "3".into(), 6),
                ("d".into(), "x y  ".into(), 7),
                ("e".into(), "one two".into(), 8),
                ("f".into(), "".into(), 10),
            ]
        );
    }

    #[test]
    fn escapes() {
        assert_eq!(kv("a\\=b = c\\:d\\u0041\\\\"), vec![("a=b".into(), "c:dA\\".into(), 1)]);
    }
}
