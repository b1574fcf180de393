//! The command-line reference: each binary's and each subcommand's `--help`, from clap.

use clap::CommandFactory;

/// The whole page: `vipwatch` and `vipwatch-haproxy`, each with every subcommand.
pub fn page() -> String {
    let mut out = format!(
        "# Command line\n\n{}\nTwo binaries: `vipwatch` (the controller) and `vipwatch-haproxy` (the HAProxy \
         agent on a load-balancer host). Each subcommand's section is its `--help`. Exit status: 0 on \
         success, 2 for an invalid configuration (one message naming the key), 1 for any other failure.\n",
        crate::generated_by("the clap definitions in `src/cli.rs` and `crates/haproxy-agent/src/cli.rs`")
    );
    out += &binary(vipwatch::cli::Cli::command());
    out += &binary(vipwatch_haproxy::cli::Cli::command());
    out
}

fn binary(mut root: clap::Command) -> String {
    root.build();
    let name = root.get_name().to_owned();
    let mut out = format!("\n## `{name}` {{#{name}}}\n\n{}", help(&mut root));
    for sub in root.get_subcommands_mut().filter(|s| s.get_name() != "help") {
        let full = format!("{name} {}", sub.get_name());
        out += &format!("\n### `{full}` {{#{}}}\n\n{}", full.replace(' ', "-"), help(sub));
    }
    out
}

/// `--help` as a text block (clap renders no colours into a string).
fn help(cmd: &mut clap::Command) -> String {
    let text = cmd.render_long_help().to_string();
    let text: Vec<&str> = text.lines().map(str::trim_end).collect();
    format!("```text\n{}\n```\n", text.join("\n").trim_end())
}
