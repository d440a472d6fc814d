//! Names and values the API server accepts, and messages that quote user input (pure; below
//! every step of the pipeline).

/// Whether `v` can be a label value (empty, or up to 63 alphanumerics, `-`, `_`, `.`, starting
/// and ending with an alphanumeric).
pub fn valid_label_value(v: &str) -> bool {
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    v.is_empty()
        || (v.len() <= 63
            && ends(v.chars().next())
            && ends(v.chars().last())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
}

/// At most `max` characters of `s`, with "…" when cut (for messages that quote user input).
pub fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A DNS-1123 subdomain: the name of most Kubernetes objects.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}
