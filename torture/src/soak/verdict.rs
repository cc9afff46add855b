//! The soak's verdict: a least-squares slope per metric over the last half of the run,
//! judged against the metric's rule. Pure functions over the samples, unit-tested.

use std::collections::BTreeMap;

/// One sample: seconds since the soak started, and each metric's value then (a metric
/// whose probe failed is missing from that sample).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Seconds since the start.
    pub t: f64,
    /// Metric name → value.
    pub values: BTreeMap<String, f64>,
}

/// How a metric is judged over the last half of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// The slope (units per hour) must stay below this.
    SlopeBelow(f64),
    /// The rise the slope makes over the judged window (slope × window) must stay within
    /// `max(floor, rel × median)`: a gauge that moves with the traffic but does not grow.
    Bounded {
        /// The allowance in the metric's own units.
        floor: f64,
        /// The allowance as a fraction of the window's median.
        rel: f64,
    },
    /// Shown, not judged (a counter whose slope is a rate: an etcd revision, log lines).
    Info,
}

impl Rule {
    /// The rule in words, for the report's table.
    pub fn describe(&self) -> String {
        match self {
            Rule::SlopeBelow(limit) => format!("slope < {limit}/h"),
            Rule::Bounded { floor, rel } => {
                format!("rise ≤ max({floor}, {:.0}% of median)", rel * 100.0)
            }
            Rule::Info => "shown only".to_string(),
        }
    }
}

/// The rule of a metric, by its name: RSS by its slope (the issue's target, < 0.1 MB/h);
/// fds and threads flat (a few fds or threads of allowance); tokio tasks and every
/// server gauge (keys, rows, sessions, connections, locks, leases) bounded; counters
/// (revisions, log lines, aborted connections) and sizes that only compaction shrinks
/// shown only.
pub fn rule_for(metric: &str) -> Rule {
    let name = metric.rsplit('.').next().unwrap_or(metric);
    match name {
        "rss_mb" => Rule::SlopeBelow(0.1),
        "fds" => Rule::Bounded {
            floor: 4.0,
            rel: 0.0,
        },
        "threads" => Rule::Bounded {
            floor: 2.0,
            rel: 0.0,
        },
        _ if is_counter(name) || metric.starts_with("log_lines") => Rule::Info,
        _ => Rule::Bounded {
            floor: 5.0,
            rel: 0.1,
        },
    }
}

fn is_counter(name: &str) -> bool {
    name.ends_with("_total")
        || name == "revision"
        || name == "db_size_mb"
        || name == "used_memory_mb"
}

/// The least-squares slope of `points` (x, y) in y-units per x-unit; `None` for fewer
/// than two points or when every x is the same.
///
/// ```
/// use dlock_torture::soak::verdict::slope;
/// assert_eq!(slope(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), Some(2.0));
/// assert_eq!(slope(&[(0.0, 1.0)]), None);
/// ```
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    Some(sxy / sxx)
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    })
}

/// Fewest points in the judged window for a slope to mean anything.
pub const MIN_POINTS: usize = 4;

/// One metric's line of the verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricVerdict {
    /// The metric's name (`rss_mb`, `redis.keys`, …).
    pub metric: String,
    /// Its rule.
    pub rule: Rule,
    /// Its first and last value in the whole run.
    pub first: f64,
    /// See `first`.
    pub last: f64,
    /// Its lowest and highest value in the judged window.
    pub min: f64,
    /// See `min`.
    pub max: f64,
    /// Least-squares slope over the judged window, per hour.
    pub slope_per_hour: Option<f64>,
    /// Points in the judged window.
    pub points: usize,
    /// `None` for a shown-only metric; else whether it passed.
    pub passed: Option<bool>,
    /// Why it failed, in words (empty if it passed).
    pub why: String,
}

/// Judges one metric's series (seconds, value) over the points at or after `from` seconds.
/// Returns `None` for an empty series.
pub fn judge(metric: &str, rule: Rule, series: &[(f64, f64)], from: f64) -> Option<MetricVerdict> {
    let first = series.first()?.1;
    let last = series.last()?.1;
    let window: Vec<(f64, f64)> = series.iter().copied().filter(|p| p.0 >= from).collect();
    let hours: Vec<(f64, f64)> = window.iter().map(|p| (p.0 / 3600.0, p.1)).collect();
    let values: Vec<f64> = window.iter().map(|p| p.1).collect();
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let slope_per_hour = slope(&hours);
    let span_hours = match (hours.first(), hours.last()) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0.0,
    };
    let (passed, why) = match (rule, slope_per_hour) {
        (Rule::Info, _) => (None, String::new()),
        (_, _) if window.len() < MIN_POINTS => (
            Some(false),
            format!(
                "{} points in the judged half, fewer than {MIN_POINTS}",
                window.len()
            ),
        ),
        (_, None) => (Some(false), "no slope".to_string()),
        (Rule::SlopeBelow(limit), Some(s)) => {
            if s < limit {
                (Some(true), String::new())
            } else {
                (Some(false), format!("slope {s:.3}/h ≥ {limit}/h"))
            }
        }
        (Rule::Bounded { floor, rel }, Some(s)) => {
            let allowance = floor.max(rel * median(&values).unwrap_or(0.0));
            let rise = s * span_hours;
            if rise <= allowance {
                (Some(true), String::new())
            } else {
                (
                    Some(false),
                    format!("rose {rise:.1} over the judged half (allowed {allowance:.1})"),
                )
            }
        }
    };
    Some(MetricVerdict {
        metric: metric.to_string(),
        rule,
        first,
        last,
        min: if window.is_empty() { f64::NAN } else { min },
        max: if window.is_empty() { f64::NAN } else { max },
        slope_per_hour,
        points: window.len(),
        passed,
        why,
    })
}

/// Judges every metric that appears in `samples` over the last half of the run
/// (samples at or after half of the last sample's time), each by [`rule_for`].
pub fn judge_all(samples: &[Sample]) -> Vec<MetricVerdict> {
    let end = samples.last().map_or(0.0, |s| s.t);
    let start = samples.first().map_or(0.0, |s| s.t);
    let from = start + (end - start) / 2.0;
    let mut series: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for sample in samples {
        for (name, value) in &sample.values {
            series.entry(name).or_default().push((sample.t, *value));
        }
    }
    series
        .iter()
        .filter_map(|(name, points)| judge(name, rule_for(name), points, from))
        .collect()
}

/// Whether every judged metric passed (and at least one was judged).
pub fn passed(verdicts: &[MetricVerdict]) -> bool {
    let judged: Vec<bool> = verdicts.iter().filter_map(|v| v.passed).collect();
    !judged.is_empty() && judged.iter().all(|p| *p)
}
