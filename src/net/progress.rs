//! What a person at a terminal sees of a running node: one progress line (round, accuracy,
//! peers) that log lines scroll above.
//!
//! Owns: the bar (shown only when stderr is a terminal and logs are text; otherwise the
//! node's log lines are the progress), and the log writer that prints around it.
//! Must not: decide anything about rounds or read the node's state itself: the node pushes
//! what it shows through [`show`].

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::Write;
use std::sync::OnceLock;

static BAR: OnceLock<ProgressBar> = OnceLock::new();

/// Starts the bar when stderr is a terminal (and logs are text); returns whether it did. Call
/// before any log line is written.
pub fn start(json_logs: bool) -> bool {
    if json_logs || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return false;
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} round {pos}{len_part} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner())
            .with_key(
                "len_part",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    if let Some(len) = s.len() {
                        let _ = write!(w, "/{len}");
                    }
                },
            ),
    );
    bar.set_message("waiting for peers");
    BAR.set(bar).is_ok()
}

/// Whether the bar is shown (per-round log lines are then left to `RUST_LOG=debug`).
pub fn shown() -> bool {
    BAR.get().is_some()
}

/// Updates the bar: rounds done (of `total`, when known), the last accuracy, peers connected.
pub fn show(done: u64, total: Option<u64>, accuracy: Option<(u64, f64)>, peers: (usize, usize)) {
    let Some(bar) = BAR.get() else { return };
    if bar.length() != total {
        match total {
            Some(t) => bar.set_length(t),
            None => bar.unset_length(),
        }
    }
    bar.set_position(done);
    let acc = accuracy.map_or(String::new(), |(r, a)| {
        format!("accuracy {:.2} % (round {r}) · ", 100.0 * a)
    });
    bar.set_message(format!("{acc}{} of {} peers connected", peers.0, peers.1));
}

/// Removes the bar before the closing lines.
pub fn finish() {
    if let Some(bar) = BAR.get() {
        bar.finish_and_clear();
    }
}

/// A log line's writer: buffers the line, then prints it above the bar (plain stderr without
/// one).
#[derive(Default)]
pub struct LogLine(Vec<u8>);

impl Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let line = std::mem::take(&mut self.0);
        let print = || {
            let _ = std::io::stderr().write_all(&line);
        };
        match BAR.get() {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }
}
