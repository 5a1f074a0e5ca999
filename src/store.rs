//! Durable files: whole-file atomic replacement (temporary file, fsync, rename, fsync of the
//! directory), so a crash at any instant leaves either the old file or the new one.
//! Owns: that write discipline and the framed, versioned file header used by shards and
//! checkpoints.
//! Must not: know what the bytes mean.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself is durable only once the directory is synced.
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A file header: 8 magic bytes, then a little-endian u32 format version.
pub fn header(magic: &[u8; 8], version: u32) -> Vec<u8> {
    let mut h = magic.to_vec();
    h.extend(version.to_le_bytes());
    h
}

/// Checks and strips a [`header`]; the error says what is wrong.
pub fn strip_header<'a>(
    bytes: &'a [u8],
    magic: &[u8; 8],
    version: u32,
) -> Result<&'a [u8], String> {
    if bytes.len() < 12 {
        return Err(format!(
            "truncated: {} bytes, shorter than the 12-byte header",
            bytes.len()
        ));
    }
    if &bytes[..8] != magic {
        return Err(format!(
            "bad magic {:?}, expected {:?}",
            String::from_utf8_lossy(&bytes[..8]),
            String::from_utf8_lossy(magic)
        ));
    }
    let v = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if v != version {
        return Err(format!(
            "format version {v}, this build reads version {version}"
        ));
    }
    Ok(&bytes[12..])
}

/// Decodes bincode-2 (standard configuration) from `body`, with every length inside checked
/// against a bound before anything is allocated for it: the smallest of 64 KiB, 1 MiB, 16 MiB,
/// 256 MiB, 4 GiB and 64 GiB that is at least twice the body. Corrupt or hostile bytes then give
/// an error, never an allocation of what a bogus length claims (which aborts the process).
/// Returns the value and the bytes read.
pub fn decode_bounded<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(T, usize), String> {
    fn with<T: serde::de::DeserializeOwned, const L: usize>(
        body: &[u8],
    ) -> Result<(T, usize), String> {
        bincode::serde::decode_from_slice(body, bincode::config::standard().with_limit::<L>())
            .map_err(|e| e.to_string())
    }
    match body.len().saturating_mul(2) {
        n if n <= 1 << 16 => with::<T, { 1 << 16 }>(body),
        n if n <= 1 << 20 => with::<T, { 1 << 20 }>(body),
        n if n <= 1 << 24 => with::<T, { 1 << 24 }>(body),
        n if n <= 1 << 28 => with::<T, { 1 << 28 }>(body),
        n if n <= 1 << 32 => with::<T, { 1 << 32 }>(body),
        n if n <= 1 << 36 => with::<T, { 1 << 36 }>(body),
        _ => Err(format!(
            "{} bytes is more than this build decodes",
            body.len()
        )),
    }
}

/// Decodes a whole body with [`decode_bounded`]: undecodable or trailing bytes are an error.
pub fn decode_exact<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let (value, used): (T, usize) =
        decode_bounded(body).map_err(|e| format!("undecodable ({e})"))?;
    if used != body.len() {
        return Err("trailing bytes".into());
    }
    Ok(value)
}

/// Decodes a checkpoint of format `version` as `T`, or one of the `previous` format as `Old`
/// converted to `T` (a migration); any other header is refused with the current format's error.
pub fn decode_migrating<T, Old>(
    bytes: &[u8],
    magic: &[u8; 8],
    version: u32,
    previous: u32,
) -> Result<T, String>
where
    T: serde::de::DeserializeOwned,
    Old: serde::de::DeserializeOwned + Into<T>,
{
    match strip_header(bytes, magic, version) {
        Ok(body) => decode_exact(body),
        Err(e) => match strip_header(bytes, magic, previous) {
            Ok(body) => decode_exact::<Old>(body).map(Into::into),
            Err(_) => Err(e),
        },
    }
}

/// Reads a file written by [`write_versioned`]: `None` when it does not exist; an error naming
/// the file when it cannot be read, has another header or does not decode.
pub fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
) -> Result<Option<T>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let body =
        strip_header(&bytes, magic, version).map_err(|e| format!("{}: {e}", path.display()))?;
    let (value, _) =
        decode_bounded(body).map_err(|e| format!("{}: undecodable ({e})", path.display()))?;
    Ok(Some(value))
}

/// Writes `value` atomically behind the versioned header.
pub fn write_versioned<T: serde::Serialize>(
    path: &Path,
    magic: &[u8; 8],
    version: u32,
    value: &T,
) -> Result<(), String> {
    let mut bytes = header(magic, version);
    bincode::serde::encode_into_std_write(value, &mut bytes, bincode::config::standard())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    write_atomic(path, &bytes).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_bogus_length_is_an_error_not_an_allocation() {
        // A string claiming 2^62 bytes (varint marker 253 + u64), then nothing.
        let mut body = vec![253u8];
        body.extend((1u64 << 62).to_le_bytes());
        let r = super::decode_bounded::<String>(&body);
        assert!(r.is_err(), "{r:?}");
        let r = super::decode_bounded::<(u64, Vec<String>)>(&[7, 1, 253, 0, 0, 0, 0, 0, 0, 0, 64]);
        assert!(r.is_err(), "{r:?}");
        // A real value still decodes.
        let ok = bincode::serde::encode_to_vec("hello", bincode::config::standard()).unwrap();
        assert_eq!(super::decode_bounded::<String>(&ok).unwrap().0, "hello");
    }
    use super::*;

    #[test]
    fn replaces_whole_files_and_checks_headers() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/f.bin");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
        let mut b = header(b"FEDTEST1", 3);
        b.extend(b"body");
        assert_eq!(strip_header(&b, b"FEDTEST1", 3).unwrap(), b"body");
        assert!(
            strip_header(&b, b"FEDTEST1", 4)
                .unwrap_err()
                .contains("version 3")
        );
        assert!(
            strip_header(&b, b"FEDOTHER", 3)
                .unwrap_err()
                .contains("magic")
        );
        assert!(
            strip_header(&b[..5], b"FEDTEST1", 3)
                .unwrap_err()
                .contains("truncated")
        );
    }

    #[test]
    fn versioned_files_round_trip_and_refuse_other_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        assert_eq!(read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 1), Ok(None));
        write_versioned(&path, b"TESTFIL1", 1, &vec![3u32, 5]).unwrap();
        assert_eq!(
            read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 1),
            Ok(Some(vec![3, 5]))
        );
        assert!(read_versioned::<Vec<u32>>(&path, b"OTHERFL1", 1).is_err());
        assert!(read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 2).is_err());
        std::fs::write(&path, b"garbage").unwrap();
        let e = read_versioned::<Vec<u32>>(&path, b"TESTFIL1", 1).unwrap_err();
        assert!(e.contains("state.bin"), "{e}");
    }
}
