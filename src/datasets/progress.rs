//! What a download tells its caller as it goes, and the two ways of showing it.
//! Owns: [`Event`], and [`Printer`]: a byte progress bar on a terminal (the style of
//! `federico swarm`'s bar), plain log lines otherwise.
//! Must not: decide anything about the download.

use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;

/// Something that happened during `download`.
#[derive(Debug)]
pub enum Event<'a> {
    /// A file is verified on disk already: nothing to fetch.
    Present {
        /// The file.
        path: &'a Path,
    },
    /// A file is on disk but not the published one: it is fetched again and replaced only once
    /// the new copy verifies.
    Replacing {
        /// The file.
        path: &'a Path,
        /// Its SHA-256 now.
        actual: &'a str,
    },
    /// Bytes start arriving for `path` (a `.part` file), from byte `from` of `total`.
    Started {
        /// The `.part` file.
        path: &'a Path,
        /// Where from.
        url: &'a str,
        /// Bytes already there (a resumed download), else 0.
        from: u64,
        /// The whole size.
        total: u64,
    },
    /// More bytes arrived.
    Bytes(u64),
    /// The transfer started last ended (complete or not).
    Stopped,
    /// A file passed its size and hash check and is in place.
    Verified {
        /// The file.
        path: &'a Path,
    },
}

/// Shows [`Event`]s on stderr.
pub struct Printer {
    terminal: bool,
    bar: Option<ProgressBar>,
}

impl Printer {
    /// A progress bar when `terminal`, else one line per event.
    pub fn new(terminal: bool) -> Self {
        Self {
            terminal,
            bar: None,
        }
    }

    /// Shows one event.
    pub fn show(&mut self, event: Event<'_>) {
        match event {
            Event::Present { path } => {
                self.line(format!("{}: already present, verified", path.display()))
            }
            Event::Replacing { path, actual } => self.line(format!(
                "{}: present but not the published file (SHA-256 {actual}); downloading it again",
                path.display()
            )),
            Event::Started {
                path,
                url,
                from,
                total,
            } => {
                let what = if from > 0 {
                    format!("resuming at {from} of {total} bytes")
                } else {
                    format!("{total} bytes")
                };
                // Shown as the file it becomes, not the `.part` it is written to.
                let shown = path.with_extension("");
                let shown = match path.extension() {
                    Some(e) if e == "part" => shown.as_path(),
                    _ => path,
                };
                self.line(format!("{url} -> {}: {what}", shown.display()));
                if self.terminal {
                    let bar = ProgressBar::new(total);
                    bar.set_style(
                        ProgressStyle::with_template(
                            "{elapsed_precise} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
                    bar.set_position(from);
                    bar.set_message(
                        shown
                            .file_name()
                            .unwrap_or_default()
                            .to_string_lossy()
                            .into_owned(),
                    );
                    self.bar = Some(bar);
                }
            }
            Event::Bytes(n) => {
                if let Some(bar) = &self.bar {
                    bar.inc(n);
                }
            }
            Event::Stopped => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
            }
            Event::Verified { path } => {
                self.line(format!("{}: downloaded, verified", path.display()))
            }
        }
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}
