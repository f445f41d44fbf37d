//! Printing: one place that turns rows into a plain comfy-table (no colours, no terminal
//! probing, so output pasted into an incident channel or a file looks the same) or into JSON.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

use crate::error::CliError;

/// A table with `header` (none when empty), ready for rows.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Disabled);
    if !header.is_empty() {
        t.set_header(header.iter().copied());
    }
    t
}

/// `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::Usage(format!("cannot encode the output as JSON: {e}")))?;
    emit(&text);
    Ok(())
}

/// Writes `text` and a newline to stdout. A closed pipe (`shardlease leases | head`) ends the
/// process quietly, as it does for other command-line tools, instead of a panic.
pub fn emit(text: &str) {
    emit_raw(&format!("{text}\n"));
}

/// Writes `text` as it is to stdout (see [`emit`]).
pub fn emit_raw(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("shardlease: cannot write to stdout: {e}");
        std::process::exit(i32::from(crate::error::code::STORE));
    }
}
