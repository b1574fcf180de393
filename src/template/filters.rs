//! The minijinja environment templates render in: strict undefined, a fuel budget, JSON auto-escape
//! for bodies, no `safe` filter, and the URL filters `path_segment` and `query`.

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Characters `path_segment` leaves alone: RFC 3986 unreserved (`A-Z a-z 0-9 - . _ ~`).
pub(super) const URL_PART: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The minijinja environment every endpoint uses: strict undefined, `fuel` instructions per render,
/// JSON auto-escape for `*.body` templates, no `safe` filter, plus `path_segment` and `query`.
pub fn environment(fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(fuel));
    env.set_auto_escape_callback(|name| if name.ends_with(".body") { AutoEscape::Json } else { AutoEscape::None });
    env.remove_filter("safe");
    env.add_filter("path_segment", path_segment);
    env.add_filter("query", query);
    env
}

/// The text of a URL filter's value; none (null) is an error: it would leave an empty segment or
/// value (`/vips//web`) rather than fail.
fn url_text(filter: &str, value: &Value) -> Result<String, minijinja::Error> {
    if value.is_none() || value.is_undefined() {
        let why = format!("{filter}: the value is none (an empty URL part is refused)");
        return Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why));
    }
    Ok(value.as_str().map_or_else(|| value.to_string(), str::to_owned))
}

/// `{{ value|query }}`: percent-encodes like `path_segment`, for one query value (may be empty).
fn query(value: &Value) -> Result<String, minijinja::Error> {
    Ok(utf8_percent_encode(&url_text("query", value)?, URL_PART).to_string())
}

/// `{{ value|path_segment }}`: percent-encodes everything but RFC 3986 unreserved characters, `/`
/// included, so a value stays one URL path segment (or one query value).
///
/// Errors (the delivery fails as a template error): none, an empty value, `.` and `..` — URL
/// parsers resolve dot segments (RFC 3986 5.2.4), so `..` from an annotation would climb out of
/// its place in the path (`/tenants/../apps/web` is `/apps/web`).
fn path_segment(value: &Value) -> Result<String, minijinja::Error> {
    let text = url_text("path_segment", value)?;
    if matches!(text.as_str(), "" | "." | "..") {
        let why = format!("path_segment: `{text}` is not a path segment (empty and dot segments are refused)");
        return Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, why));
    }
    Ok(utf8_percent_encode(&text, URL_PART).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segment_encodes_slashes_and_reserved_characters() {
        assert_eq!(path_segment(&Value::from("a/b c?d#e%f")).unwrap(), "a%2Fb%20c%3Fd%23e%25f");
        assert_eq!(path_segment(&Value::from("web-1.shop_x~")).unwrap(), "web-1.shop_x~");
        assert_eq!(path_segment(&Value::from(42)).unwrap(), "42");
        assert_eq!(path_segment(&Value::from("...")).unwrap(), "...");
    }

    #[test]
    fn path_segment_refuses_dot_segments_empty_and_none_and_query_only_none() {
        for bad in [Value::from(".."), Value::from("."), Value::from(""), Value::from(())] {
            let e = path_segment(&bad).unwrap_err();
            assert_eq!(e.kind(), minijinja::ErrorKind::InvalidOperation, "{bad:?}");
        }
        assert_eq!(query(&Value::from("")).unwrap(), "");
        assert_eq!(query(&Value::from("..")).unwrap(), "..");
        assert_eq!(query(&Value::from(())).unwrap_err().kind(), minijinja::ErrorKind::InvalidOperation);
    }

    #[test]
    fn the_safe_filter_is_gone_and_undefined_is_an_error() {
        let mut env = environment(10_000);
        env.add_template_owned("t.body", "{{ x|safe }}").unwrap();
        let e = env.get_template("t.body").unwrap().render(minijinja::context! { x => "1" }).unwrap_err();
        assert_eq!(e.kind(), minijinja::ErrorKind::UnknownFilter);
        env.add_template_owned("u.body", "{{ svc.nmae }}").unwrap();
        let e = env
            .get_template("u.body")
            .unwrap()
            .render(minijinja::context! { svc => minijinja::context!{ name => "w" } });
        assert_eq!(e.unwrap_err().kind(), minijinja::ErrorKind::UndefinedError);
    }

    #[test]
    fn fuel_stops_a_runaway_loop() {
        let mut env = environment(10_000);
        env.add_template_owned("t.body", "[{% for i in range(100000) %}{{ i }},{% endfor %}0]").unwrap();
        let e = env.get_template("t.body").unwrap().render(()).unwrap_err();
        assert_eq!(e.kind(), minijinja::ErrorKind::OutOfFuel);
    }
}
