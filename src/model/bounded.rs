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
    fn a_bound_shorter_than_the_marker_gives_the_marker() {
        assert_eq!(bounded(&"x".repeat(5034), 10), "…[cut from 5034 bytes]");
        assert_eq!(bound("x".repeat(2000), 1024).len(), 1024);
    }
}
