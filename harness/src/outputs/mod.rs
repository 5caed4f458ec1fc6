//! Layer 5, outputs: the reporters fed by the runner's events (progress, JSONL, JSON, JUnit,
//! Markdown) and the HTML site.

pub mod matrix;
pub mod progress;
pub mod report;
pub mod site;

#[cfg(test)]
mod evidence_reaches_the_page;
