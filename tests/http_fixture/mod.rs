//! A tiny HTTP/1.1 file server on 127.0.0.1 for the download tests: GET only, `Range:
//! bytes=N-` honoured or ignored on request, every request logged, and optionally the first
//! answer cut short to simulate a dropped connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One request the server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// The path asked for, without the leading `/`.
    pub path: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// The status answered.
    pub status: u16,
    /// Body bytes sent.
    pub sent: usize,
}

/// How the server behaves.
#[derive(Clone, Copy, Debug, Default)]
pub struct Behaviour {
    /// Answer `Range: bytes=N-` with 206 and the rest of the file; else always 200 and all.
    pub honour_range: bool,
    /// Cut the first answer after this many body bytes (the headers announce them all).
    pub cut_first_after: Option<usize>,
}

/// A running server; it lives until the test process ends.
pub struct Server {
    port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Server {
    /// Serves `files` (path without leading `/` → bytes).
    pub fn start(files: Vec<(String, Vec<u8>)>, behaviour: Behaviour) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let log = hits.clone();
        let files: HashMap<String, Vec<u8>> = files.into_iter().collect();
        std::thread::spawn(move || {
            let mut first = true;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let cut = if first {
                    behaviour.cut_first_after
                } else {
                    None
                };
                if answer(stream, &files, behaviour.honour_range, cut, &log).is_some() {
                    first = false;
                }
            }
        });
        Server { port, hits }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request answered so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

fn answer(
    stream: TcpStream,
    files: &HashMap<String, Vec<u8>>,
    honour_range: bool,
    cut: Option<usize>,
    log: &Mutex<Vec<Hit>>,
) -> Option<()> {
    // A hit is logged before its answer is written: a client that has read the whole answer
    // and asks `hits()` must find it there (logging after the write raced with the client).
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line).ok()?;
    let path = request_line
        .split_whitespace()
        .nth(1)?
        .trim_start_matches('/')
        .to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    let mut out = stream;
    let Some(body) = files.get(&path) else {
        let msg = b"not found";
        let head = format!(
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            msg.len()
        );
        log.lock().unwrap().push(Hit {
            path,
            range,
            status: 404,
            sent: msg.len(),
        });
        out.write_all(head.as_bytes()).ok()?;
        out.write_all(msg).ok()?;
        return Some(());
    };
    let start = match (&range, honour_range) {
        (Some(r), true) => r
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse::<usize>().ok()),
        _ => None,
    };
    let (status, head, slice) = match start {
        Some(s) if s >= body.len() => (
            416,
            format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n",
                body.len()
            ),
            &body[..0],
        ),
        Some(s) => (
            206,
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {s}-{}/{}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len() - 1,
                body.len(),
                body.len() - s
            ),
            &body[s..],
        ),
        None => (
            200,
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            ),
            &body[..],
        ),
    };
    let slice = match cut {
        Some(n) => &slice[..n.min(slice.len())],
        None => slice,
    };
    log.lock().unwrap().push(Hit {
        path,
        range,
        status,
        sent: slice.len(),
    });
    out.write_all(head.as_bytes()).ok()?;
    out.write_all(slice).ok()?;
    out.flush().ok()?;
    Some(())
}
