//! What the CLI prints: aligned tables for humans (colours only on a
//! terminal, never with `NO_COLOR`), JSON or YAML of the API's own answers
//! for scripts (`-o json` parses back into the API types).

use std::io::IsTerminal;

use serde::Serialize;

use super::client::{CliError, CliResult, Exit};

/// `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// How to print: the format and whether colours are allowed.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    pub format: Format,
    colour: bool,
}

/// A colour for a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Good,
    Bad,
    Warn,
}

impl Printer {
    pub fn new(format: Format) -> Self {
        let colour =
            std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Self { format, colour }
    }

    pub fn paint(&self, text: &str, tone: Tone) -> String {
        let code = match tone {
            Tone::Plain => return text.to_string(),
            Tone::Good => "32",
            Tone::Bad => "31",
            Tone::Warn => "33",
        };
        if self.colour { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_string() }
    }

    /// Prints `value` as JSON or YAML; `false` when the format is a table
    /// (the caller prints its own).
    pub fn structured(&self, value: &impl Serialize) -> CliResult<bool> {
        let text = match self.format {
            Format::Table => return Ok(false),
            Format::Json => {
                serde_json::to_string_pretty(value).map_err(|e| CliError::new(Exit::Failed, e.to_string()))?
            }
            Format::Yaml => {
                serde_yaml_ng::to_string(value).map_err(|e| CliError::new(Exit::Failed, e.to_string()))?
            }
        };
        println!("{}", text.trim_end());
        Ok(true)
    }

    /// An aligned table: `rows` of `(text, tone)` cells under `header`.
    pub fn table(&self, header: &[&str], rows: &[Vec<(String, Tone)>]) {
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for row in rows {
            for (i, (cell, _)) in row.iter().enumerate() {
                if let Some(width) = widths.get_mut(i) {
                    *width = (*width).max(cell.chars().count());
                }
            }
        }
        let line = |cells: Vec<(String, Tone)>| {
            let last = cells.len().saturating_sub(1);
            cells
                .into_iter()
                .enumerate()
                .map(|(i, (cell, tone))| {
                    let pad = if i == last { 0 } else { widths[i].saturating_sub(cell.chars().count()) };
                    format!("{}{}", self.paint(&cell, tone), " ".repeat(pad))
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        println!("{}", line(header.iter().map(|h| (h.to_uppercase(), Tone::Plain)).collect()));
        for row in rows {
            println!("{}", line(row.clone()));
        }
    }
}

/// A plain cell.
pub fn cell(text: impl Into<String>) -> (String, Tone) {
    (text.into(), Tone::Plain)
}
