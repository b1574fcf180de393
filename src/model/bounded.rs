//! Text from outside (a receiver's answer and headers, an appliance's errors, a Kubernetes object's
//! annotations, an apiserver's messages) is kept, logged and served only within a bound, with a
//! marker where it was cut, so a hostile or broken peer cannot fill the database, the log or an API
//! answer.

use std::borrow::Cow;

/// The most of a receiver's response body kept in the attempt log (bytes).
pub const RESPONSE_BODY: usize = 4 * 1024;
/// The most of a header value from outside kept or logged (bytes): a `Location`, a `Retry-After`.
pub const HEADER: usize = 1024;
/// The most of an error message kept or served (bytes): a transport error, an apiserver's `Status`
/// message, a reason built from an annotation.
pub const MESSAGE: usize = 1024;
/// The most of a value quoted inside a longer message (bytes): an annotation value in an allocation
/// reason, a header value in a log line.
pub const QUOTE: usize = 128;

/// `text` when it fits in `max` bytes; else its longest prefix that ends on a character boundary and
/// leaves room for the marker `…[cut from N bytes]`, followed by it, so the result is at most
/// `max` bytes (a `max` shorter than the marker gives the marker alone).
pub fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let marker = format!("…[cut from {} bytes]", text.len());
    let mut keep = max.saturating_sub(marker.len());
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    Cow::Owned(format!("{}{marker}", &text[..keep]))
}

/// `text` on one line: every control character (line breaks, escape sequences, NUL) written as its
/// Rust escape (`\n`, `\u{1b}`), so a peer's text cannot forge log lines or terminal output, or
/// break an Event note or an API answer into lines. Borrowed when there is none.
pub fn one_line(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let escaped = text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() });
    Cow::Owned(escaped.collect())
}

/// The most of a receiver's reason kept in an attempt's error (bytes).
pub const REASON: usize = 512;

/// A receiver's or an appliance's own reason for refusing, from its answer's body: the `detail`
/// (else `title`) of an RFC 9457 problem, a JSON object's `message` or `error`, or a one-line text;
/// on one line ([`one_line`]) and at most [`REASON`] bytes. `None` for an empty, HTML or other
/// multi-line body.
pub fn reason(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let why = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(json) => ["detail", "message", "error", "title"]
            .iter()
            .find_map(|k| json.get(k).and_then(|v| v.as_str()).filter(|s| !s.is_empty()))?
            .to_owned(),
        Err(_) if !text.is_empty() && !text.contains('\n') && !text.starts_with('<') => text.to_owned(),
        Err(_) => return None,
    };
    Some(bound(one_line(&why).into_owned(), REASON))
}

/// [`bounded`] for an owned string, without a copy when it fits.
pub fn bound(text: String, max: usize) -> String {
    match bounded(&text, max) {
        Cow::Borrowed(_) => text,
        Cow::Owned(cut) => cut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_fits_is_kept_whole() {
        assert_eq!(bounded("abc", 3), "abc");
        assert!(matches!(bounded("abc", 3), Cow::Borrowed(_)));
    }

    #[test]
    fn longer_text_is_cut_on_a_character_boundary_with_a_marker_within_the_bound() {
        let text = "é".repeat(100); // 200 bytes
        let cut = bounded(&text, 50);
        let marker = "…[cut from 200 bytes]"; // 23 bytes: 27 left, 13 é fit
        assert_eq!(cut, format!("{}{marker}", "é".repeat(13)));
        assert_eq!(cut.len(), 49);
    }

    #[test]
    fn control_characters_are_escaped_so_text_stays_on_one_line() {
        assert!(matches!(one_line("HTTP 422: taken"), Cow::Borrowed(_)));
        let forged = "line1\r\nFAKE INFO vipwatch::publish: injected\u{1b}[2J\u{0}";
        assert_eq!(one_line(forged), "line1\\r\\nFAKE INFO vipwatch::publish: injected\\u{1b}[2J\\u{0}");
    }

    #[test]
    fn a_reason_comes_from_a_problem_a_message_or_one_line_of_text_and_stays_on_one_line() {
        assert_eq!(
            reason(br#"{"title":"Conflict","detail":"127.0.100.0:80 is bound"}"#).unwrap(),
            "127.0.100.0:80 is bound"
        );
        assert_eq!(reason(br#"{"code":422,"message":"declaration is invalid"}"#).unwrap(), "declaration is invalid");
        assert_eq!(reason(b"rate limited\n").unwrap(), "rate limited");
        assert_eq!(reason(br#"{"detail":"a\nFAKE line"}"#).unwrap(), "a\\nFAKE line");
        assert_eq!(reason(b"<html>\n<body>busy</body>"), None);
        assert_eq!(reason(br#"{"detail":""}"#), None);
        assert_eq!(reason(&[b'x'; 5000]).unwrap().len(), REASON);
    }

    #[test]
    fn a_bound_shorter_than_the_marker_gives_the_marker() {
        assert_eq!(bounded(&"x".repeat(5034), 10), "…[cut from 5034 bytes]");
        assert_eq!(bound("x".repeat(2000), 1024).len(), 1024);
    }
}
