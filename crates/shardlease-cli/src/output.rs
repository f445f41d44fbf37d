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
    println!("{text}");
    Ok(())
}
