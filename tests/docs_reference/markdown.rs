//! Markdown pieces the generated pages share.

/// `text` made safe for one cell of a Markdown table: paragraphs joined by `<br><br>`, line breaks
/// and runs of spaces folded, `|` escaped.
pub fn cell(text: &str) -> String {
    text.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("<br><br>")
        .replace('|', "\\|")
}

/// A Markdown table: `header` and one row per item of `rows`, each already made of cells.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out =
        format!("| {} |\n|{}|\n", header.join(" | "), header.iter().map(|_| "---").collect::<Vec<_>>().join("|"));
    for row in rows {
        out += &format!("| {} |\n", row.join(" | "));
    }
    out
}
