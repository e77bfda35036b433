//! Figures, each with the baseline measured beside it, printed and written.

use std::io::Write as _;

/// One line of the table: a measure and its baseline, same unit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub what: String,
    pub value: f64,
    pub unit: &'static str,
    pub baseline: String,
    pub baseline_value: f64,
}

impl Row {
    pub fn new(what: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self { what: what.into(), value, unit, baseline: String::new(), baseline_value: f64::NAN }
    }

    pub fn against(mut self, baseline: impl Into<String>, value: f64) -> Self {
        self.baseline = baseline.into();
        self.baseline_value = value;
        self
    }

    fn ratio(&self) -> Option<f64> {
        (self.baseline_value.is_finite() && self.baseline_value > 0.0)
            .then(|| self.value / self.baseline_value)
    }
}

/// How a cost grows with the work: `(units, cost)` at a small and a large
/// size. The cost per unit at the large size beside the small one's (1.00x
/// is linear), and the growth exponent `log(cost ratio) / log(size ratio)`
/// beside 1 (linear).
pub fn growth(what: &str, per_unit: &'static str, small: (f64, f64), large: (f64, f64)) -> Vec<Row> {
    let exponent = (large.1 / small.1).ln() / (large.0 / small.0).ln();
    vec![
        Row::new(format!("{what}, {per_unit} at {:.0}", large.0), large.1 / large.0, per_unit)
            .against(format!("the same at {:.0}", small.0), small.1 / small.0),
        Row::new(format!("{what}, cost exponent {:.0} -> {:.0}", small.0, large.0), exponent, "")
            .against("linear", 1.0),
    ]
}

/// What one figure gave.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Measured {
        rows: Vec<Row>,
    },
    /// It should have been measured and could not be.
    Failed {
        why: String,
    },
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Figure {
    pub id: &'static str,
    pub name: &'static str,
    pub outcome: Outcome,
}

impl Figure {
    pub fn measured(id: &'static str, name: &'static str, rows: Vec<Row>) -> Self {
        Self { id, name, outcome: Outcome::Measured { rows } }
    }

    pub fn failed(id: &'static str, name: &'static str, why: impl std::fmt::Display) -> Self {
        Self { id, name, outcome: Outcome::Failed { why: why.to_string() } }
    }

    /// `Ok` rows as measured, an error as a failed figure.
    pub fn from_result(id: &'static str, name: &'static str, rows: anyhow::Result<Vec<Row>>) -> Self {
        match rows {
            Ok(rows) => Self::measured(id, name, rows),
            Err(why) => Self::failed(id, name, format!("{why:#}")),
        }
    }
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    date: String,
    cores: usize,
    figures: Vec<Figure>,
}

impl Report {
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Self { date: jiff::Timestamp::now().to_string(), cores, figures: Vec::new() }
    }

    pub fn add(&mut self, figure: Figure) {
        self.figures.push(figure);
    }

    pub fn failed(&self) -> bool {
        self.figures.iter().any(|f| matches!(f.outcome, Outcome::Failed { .. }))
    }

    /// The table, as `bench/README.md` carries it.
    pub fn table(&self) -> String {
        let mut out = format!("{} cores, {}\n\n", self.cores, self.date);
        out.push_str(
            "| figure | measure | value | baseline | baseline value | ratio |\n|---|---|---|---|---|---|\n",
        );
        for figure in &self.figures {
            match &figure.outcome {
                Outcome::Measured { rows } => {
                    for row in rows {
                        let ratio = row.ratio().map(|r| format!("{r:.2}x")).unwrap_or_default();
                        let baseline_value = if row.baseline_value.is_finite() {
                            format!("{:.2} {}", row.baseline_value, row.unit)
                        } else {
                            String::new()
                        };
                        out.push_str(&format!(
                            "| {} {} | {} | {:.2} {} | {} | {baseline_value} | {ratio} |\n",
                            figure.id, figure.name, row.what, row.value, row.unit, row.baseline
                        ));
                    }
                }
                Outcome::Failed { why } => {
                    out.push_str(&format!("| {} {} | FAILED: {why} | | | | |\n", figure.id, figure.name))
                }
            }
        }
        out
    }

    pub fn print(&self) {
        println!("{}", self.table());
    }

    pub fn write(&self, dir: &std::path::Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("latest.json"), serde_json::to_vec_pretty(self)?)?;
        std::fs::write(dir.join("latest.md"), self.table())?;
        let mut history =
            std::fs::OpenOptions::new().create(true).append(true).open(dir.join("history.jsonl"))?;
        writeln!(history, "{}", serde_json::to_string(self)?)?;
        Ok(())
    }
}
