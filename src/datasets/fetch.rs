//! One resumable HTTP download into a `.part` file.
//! Owns: the HTTP client and its timeouts, the `Range` request that continues a `.part` file,
//! the fall-back to a whole download when the server ignores it, and the byte cap.
//! Must not: hash, rename or delete a finished download (that is `download.rs`): what it
//! receives stays in the `.part` file, so the next run can continue it.

use super::progress::Event;
use super::{FetchError, io_err};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// A blocking HTTP(S) client with timeouts. Proxies come from the usual environment variables
/// (`HTTPS_PROXY`, `NO_PROXY`, …).
pub struct Fetcher {
    agent: ureq::Agent,
}

impl Default for Fetcher {
    fn default() -> Self {
        Self::new()
    }
}

impl Fetcher {
    /// A client that gives up on a connection after 30 s and on a server silent for 60 s
    /// (per read), but never on a slow, steady body.
    pub fn new() -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_resolve(Some(Duration::from_secs(30)))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            // Non-2xx answers come back as responses, so the error can name the URL.
            .http_status_as_error(false)
            .user_agent(concat!("federico/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self { agent }
    }

    /// Brings `part` to `total` bytes of `url`: continues it from its length with a `Range`
    /// request, or downloads the whole file when there is no `.part`, when it is longer than
    /// `total`, when the server ignores the range (answers 200 with the whole file) or refuses
    /// it (416). Returns when the server's answer is complete; the caller checks the size and
    /// the hash. On a network error, or a body cut before its announced length, the `.part`
    /// file keeps what arrived. At most `total + 1` bytes are accepted, so a
    /// wrong or endless body cannot fill the disk.
    pub fn fetch_to_part(
        &self,
        url: &str,
        part: &Path,
        total: u64,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), FetchError> {
        let mut have = match std::fs::metadata(part) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err(part)(e)),
        };
        if have == total {
            return Ok(());
        }
        if have > total {
            have = 0;
        }
        let mut request = self.agent.get(url);
        if have > 0 {
            request = request.header("Range", format!("bytes={have}-"));
        }
        let network = |reason: String, kept: u64| FetchError::Network {
            url: url.to_string(),
            reason,
            kept,
        };
        let response = request.call().map_err(|e| network(e.to_string(), have))?;
        let status = response.status().as_u16();
        let resumed = match status {
            206 if have > 0 && content_range_start(&response) == Some(have) => true,
            // The server ignored the range: this is the whole file, from byte 0.
            200 => false,
            // Refused, or answered with another range: start again with a plain GET.
            206 | 416 if have > 0 => {
                drop(response);
                let _ = std::fs::remove_file(part);
                return self.fetch_to_part(url, part, total, on);
            }
            status => {
                return Err(FetchError::Status {
                    url: url.to_string(),
                    status,
                });
            }
        };
        let announced = response
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let start = if resumed { have } else { 0 };
        let mut file = if resumed {
            OpenOptions::new().append(true).open(part)
        } else {
            File::create(part)
        }
        .map_err(io_err(part))?;
        on(Event::Started {
            path: part,
            url,
            from: start,
            total,
        });
        let mut body = response.into_body().into_reader().take(total - start + 1);
        let mut buf = vec![0u8; 1 << 16];
        let mut got = start;
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = file.sync_all();
                    on(Event::Stopped);
                    return Err(network(e.to_string(), got));
                }
            };
            file.write_all(&buf[..n]).map_err(io_err(part))?;
            got += n as u64;
            on(Event::Bytes(n as u64));
        }
        file.sync_all().map_err(io_err(part))?;
        on(Event::Stopped);
        // A body that ended before the length the server announced (or, without one, before
        // the published size) was cut off: keep it to resume. A complete answer of the wrong
        // size is the caller's size check to refuse.
        let body_len = got - start;
        let cut = match announced {
            Some(len) => body_len < len && got <= total,
            None => got < total,
        };
        if cut {
            return Err(network(
                format!("the connection closed after {got} of {total} bytes"),
                got,
            ));
        }
        Ok(())
    }
}

/// The first byte of a `Content-Range: bytes FIRST-LAST/TOTAL` answer.
fn content_range_start(response: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let value = response.headers().get("content-range")?.to_str().ok()?;
    parse_content_range_start(value)
}

fn parse_content_range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes")?.trim_start();
    range.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_start_is_parsed_or_refused() {
        assert_eq!(parse_content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(parse_content_range_start("bytes 0-9/*"), Some(0));
        assert_eq!(parse_content_range_start("bytes */200"), None);
        assert_eq!(parse_content_range_start("items 1-2/3"), None);
    }
}
