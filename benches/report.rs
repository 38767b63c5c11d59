//! The results: one row per (workload, variant), printed as a table and written as JSON.

use std::fmt::Write as _;

use crate::measure::Timing;

/// What became of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Checked against the CPU backend, then timed.
    Ok,
    /// The check against the CPU backend failed; not timed.
    Failed,
    /// The runtime returned an error.
    Error,
    /// Not run (for example, a workload the language cannot express yet).
    Skipped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "FAILED",
            Status::Error => "ERROR",
            Status::Skipped => "skipped",
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: String,
    pub variant: String,
    pub timing: Option<Timing>,
    /// The fewest bytes the workload must move, when bandwidth means something for it.
    pub bytes: Option<u64>,
    pub formula: String,
    /// What the workload computes (JSON only).
    pub definition: String,
    pub status: Status,
    pub note: String,
}

impl Row {
    pub fn new(id: &str, variant: &str) -> Row {
        Row {
            id: id.to_string(),
            variant: variant.to_string(),
            timing: None,
            bytes: None,
            formula: String::new(),
            definition: String::new(),
            status: Status::Ok,
            note: String::new(),
        }
    }

    pub fn ms(&self) -> Option<f64> {
        self.timing.map(|t| t.median)
    }

    /// Effective bandwidth: bytes over the median time.
    pub fn gbs(&self) -> Option<f64> {
        Some(self.bytes? as f64 / self.ms()? / 1e6)
    }

    /// The effective bandwidth as a fraction of the copy's.
    pub fn of_copy(&self, copy_gbs: Option<f64>) -> Option<f64> {
        Some(self.gbs()? / copy_gbs?)
    }

    pub fn failed(&self) -> bool {
        matches!(self.status, Status::Failed | Status::Error)
    }
}

fn cell(value: Option<f64>, width: usize, decimals: usize) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v:>width$.decimals$}"),
        _ => format!("{:>width$}", "-"),
    }
}

/// The table, with a header line.
pub fn table(rows: &[Row], copy_gbs: Option<f64>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:<34} {:>10} {:>7} {:>6}  {:<12} note",
        "id", "variant", "ms", "GB/s", "%copy", "bytes"
    );
    for row in rows {
        let pct = row.of_copy(copy_gbs).map(|f| f * 100.0);
        let note = match row.status {
            Status::Ok => row.note.clone(),
            status => format!("{} {}", status.as_str(), row.note),
        };
        let _ = writeln!(
            out,
            "{:<5} {:<34} {} {} {}  {:<12} {}",
            row.id,
            row.variant,
            cell(row.ms(), 10, 4),
            cell(row.gbs(), 7, 0),
            cell(pct, 5, 0) + if pct.is_some() { "%" } else { " " },
            row.formula,
            note.trim_end()
        );
    }
    out
}

/// The same rows as JSON, with what the run was.
pub fn json(rows: &[Row], copy_gbs: Option<f64>, header: &[(&str, String)]) -> String {
    let mut out = String::from("{\n");
    for (key, value) in header {
        let _ = writeln!(out, "  {}: {},", string(key), string(value));
    }
    let _ = writeln!(out, "  \"copy_gbs\": {},", number(copy_gbs));
    out.push_str("  \"rows\": [\n");
    for (k, row) in rows.iter().enumerate() {
        let t = row.timing;
        let fields = [
            ("id", string(&row.id)),
            ("variant", string(&row.variant)),
            ("status", string(row.status.as_str())),
            ("ms", number(row.ms())),
            ("gbs", number(row.gbs())),
            ("of_copy", number(row.of_copy(copy_gbs))),
            (
                "bytes",
                row.bytes.map_or("null".to_string(), |b| b.to_string()),
            ),
            ("bytes_formula", string(&row.formula)),
            ("definition", string(&row.definition)),
            ("ms_min", number(t.map(|t| t.min))),
            ("ms_max", number(t.map(|t| t.max))),
            ("reps", t.map_or("null".to_string(), |t| t.reps.to_string())),
            ("note", string(&row.note)),
        ];
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}: {v}", string(k)))
            .collect();
        let comma = if k + 1 < rows.len() { "," } else { "" };
        let _ = writeln!(out, "    {{{}}}{comma}", body.join(", "));
    }
    out.push_str("  ]\n}\n");
    out
}

fn number(value: Option<f64>) -> String {
    match value {
        Some(v) if v.is_finite() => format!("{v}"),
        _ => "null".to_string(),
    }
}

fn string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
