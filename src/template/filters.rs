//! The minijinja environment templates render in: strict undefined, a fuel budget, JSON auto-escape
//! for bodies, no `safe` filter, and the URL filters `path_segment` and `query`.

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Characters `path_segment` leaves alone: RFC 3986 unreserved (`A-Z a-z 0-9 - . _ ~`).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The minijinja environment every endpoint uses: strict undefined, `fuel` instructions per render,
/// JSON auto-escape for `*.body` templates, no `safe` filter, plus `path_segment` and `query`.
pub fn environment(fuel: u64) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(fuel));
    env.set_auto_escape_callback(|name| if name.ends_with(".body") { AutoEscape::Json } else { AutoEscape::None });
    env.remove_filter("safe");
    env.add_filter("path_segment", path_segment);
    env.add_filter("query", path_segment);
    env
}

/// `{{ value|path_segment }}`: percent-encodes everything but RFC 3986 unreserved characters, `/`
/// included, so a value stays one URL path segment (or one query value).
fn path_segment(value: &Value) -> String {
    let text = match value.as_str() {
        Some(s) => s.to_owned(),
        None => value.to_string(),
    };
    utf8_percent_encode(&text, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segment_encodes_slashes_and_reserved_characters() {
        assert_eq!(path_segment(&Value::from("a/b c?d#e%f")), "a%2Fb%20c%3Fd%23e%25f");
        assert_eq!(path_segment(&Value::from("web-1.shop_x~")), "web-1.shop_x~");
        assert_eq!(path_segment(&Value::from(42)), "42");
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
