//! Reading the files mounted into the pod (the CP's CA bundle, the connect
//! token, the command keys, the service account's files, a kubeconfig):
//! only a regular file is read, it is opened without blocking, and at most
//! a bound of it is read. A FIFO, a device or a directory at such a path
//! would otherwise block `open(2)` or `read(2)` for as long as nobody
//! writes it: no heartbeat, no probe answered. It is refused instead, with
//! an error that says what it is.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The most a mounted file holds: a Secret or a ConfigMap holds at most
/// 1 MiB.
pub const MOUNTED_MAX: u64 = 1024 * 1024;

/// Reads the regular file at `path` (after symbolic links, as the
/// projected volumes of a pod are), at most `max` bytes: a longer file, or
/// anything but a regular file, is an error ([`io::ErrorKind::InvalidInput`]
/// with what it is, or [`io::ErrorKind::FileTooLarge`] "over N bytes").
pub fn read(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    // O_NONBLOCK: opening a FIFO for reading returns at once (and a
    // regular file's reads ignore the flag).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    regular(&file)?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("over {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read(path, max)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// An error unless `file` is a regular file, naming what it is.
fn regular(file: &File) -> io::Result<()> {
    let kind = file.metadata()?.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({what})"),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn only_a_regular_file_is_read_and_never_waited_for() {
        let dir = std::env::temp_dir().join(format!("nexo-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ca.crt");
        std::fs::write(&file, b"pem").unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read(&file, 3).unwrap(), b"pem");
        assert_eq!(read_to_string(&link, 3).unwrap(), "pem", "through a link");
        let over = read(&file, 2).unwrap_err();
        assert_eq!(
            (over.kind(), over.to_string()),
            (io::ErrorKind::FileTooLarge, "over 2 bytes".into())
        );

        // A FIFO nobody writes: refused at once, not waited for.
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo is needed");
        let started = Instant::now();
        let e = read(&fifo, 1024).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(e.to_string(), "not a regular file (a FIFO)");
        let e = read(&dir, 1024).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a directory)");
        let e = read(Path::new("/dev/zero"), 1024).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file (a device)");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
