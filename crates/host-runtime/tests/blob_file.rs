//! Files the host reads are snapshots: what happens to a file afterwards cannot reach the host (a mapped file
//! that is truncated kills the reader with SIGBUS; this test process would die).

use std::io::Write;

use host_runtime::blob_file::BlobFile;

#[test]
fn a_file_truncated_or_replaced_after_it_was_read_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.blob");
    let original: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &original).expect("write");
    let file = BlobFile::open(&path).expect("a regular file");

    // `cp new.blob old.blob`: truncated to zero, then rewritten shorter and different.
    let mut replaced = std::fs::File::create(&path).expect("truncate");
    replaced.write_all(b"new and shorter").expect("rewrite");
    drop(replaced);

    assert_eq!(file.bytes().len(), original.len());
    assert_eq!(file.bytes(), &original[..], "every page, including those past the file's new end");
}

#[test]
fn what_is_not_a_regular_file_is_refused_before_it_is_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = BlobFile::open(dir.path()).err().expect("a directory is refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(err.to_string(), "not a regular file (it is a directory)");
    let err = BlobFile::open(std::path::Path::new("/dev/zero")).err().expect("a device is refused");
    assert_eq!(err.to_string(), "not a regular file (it is a character device)");
    let empty = dir.path().join("empty.blob");
    std::fs::write(&empty, b"").expect("write");
    assert!(BlobFile::open(&empty).expect("an empty file reads").bytes().is_empty());
}

// Issue 17, items 13 and 14: a blob stays inside its program's directory once links are resolved, and every
// file is opened once, without blocking, and checked through the descriptor that is read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delegate_abi::host::HostConfig;
use host_runtime::manifest::{BlobPaths, Manifest};
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// The example program exported into `dir/program`, its `decode.blob` moved to `dir/outside.blob` and
/// replaced by a symbolic link to it (`target` says how the link is written).
fn program_with_decode_linked_out(dir: &Path, absolute: bool) -> PathBuf {
    let program = dir.join("program");
    std::fs::create_dir(&program).expect("mkdir");
    kv_example::export::reference(&kv_example::Config::tiny(), &program).expect("export");
    let outside = dir.join("outside.blob");
    std::fs::rename(program.join("decode.blob"), &outside).expect("move the blob out");
    // Relative: up out of `program/` to the blob beside it (inside the temporary directory).
    let target = if absolute { outside } else { Path::new("..").join("outside.blob") };
    std::os::unix::fs::symlink(target, program.join("decode.blob")).expect("symlink");
    program.join("program.toml")
}

fn load(manifest: &Path, blobs: BlobPaths) -> Result<Program, host_runtime::program::Error> {
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    Program::load(Manifest::load_with(manifest, blobs).expect("manifest"), &registry, Mode::ZeroCopy)
}

#[test]
fn a_blob_linked_out_of_the_program_directory_is_refused_unless_blobs_may_be_anywhere() {
    for absolute in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = program_with_decode_linked_out(dir.path(), absolute);
        let err =
            load(&manifest, BlobPaths::WithinProgram).err().expect("a link out of the directory is refused");
        let message = err.to_string();
        let blob = manifest.with_file_name("decode.blob");
        assert!(
            message.starts_with(&format!("cannot read blob {}: it leads outside ", blob.display())),
            "{message}"
        );
        assert!(message.contains("--allow-outside-blobs"), "{message}");
        load(&manifest, BlobPaths::Anywhere).expect("the caller allowed blobs anywhere");
    }
}

#[test]
fn a_link_that_stays_inside_the_program_directory_is_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    kv_example::export::reference(&kv_example::Config::tiny(), dir.path()).expect("export");
    std::fs::create_dir(dir.path().join("blobs")).expect("mkdir");
    std::fs::rename(dir.path().join("decode.blob"), dir.path().join("blobs/decode.blob")).expect("move");
    std::os::unix::fs::symlink("blobs/decode.blob", dir.path().join("decode.blob")).expect("symlink");
    load(&dir.path().join("program.toml"), BlobPaths::WithinProgram)
        .expect("a link inside the directory loads");
}

#[test]
fn open_beneath_names_what_leads_out_and_refuses_what_is_not_under_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("mkdir");
    std::fs::write(dir.path().join("secret"), b"outside").expect("write");
    std::os::unix::fs::symlink(dir.path().join("secret"), root.join("abs.blob")).expect("symlink");
    // Up out of `root/` to `secret` beside it, inside the temporary directory.
    let up_to_secret = Path::new("..").join("secret");
    std::os::unix::fs::symlink(&up_to_secret, root.join("rel.blob")).expect("symlink");
    for name in [Path::new("abs.blob"), Path::new("rel.blob"), up_to_secret.as_path()] {
        let name = name.display().to_string();
        let err = BlobFile::open_beneath(&root, &root.join(&name)).err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{name}");
        assert!(
            err.to_string().starts_with(&format!("it leads outside {}", root.display())),
            "{name}: {err}"
        );
    }
    let err = BlobFile::open_beneath(&root, &dir.path().join("secret")).err().expect("not under the root");
    assert_eq!(err.to_string(), format!("it is not a path under {}", root.display()));
}

/// How long a race runs, and how long no open may return before it counts as blocked.
const RACE: Duration = Duration::from_secs(3);
const STUCK: Duration = Duration::from_secs(2);

/// Calls `open` on a path that another thread keeps swapping between a regular file holding `contents` and a
/// FIFO (each swap one `rename`, as an attacker with write access to the directory would), for [`RACE`];
/// returns whether an open blocked. A blocked open is freed by a watchdog that opens the FIFO for writing once
/// no open has returned for [`STUCK`], so the test ends either way.
fn an_open_blocks_on_a_fifo_swapped_in(contents: &[u8], open: impl Fn(&Path)) -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, file, fifo, spare) = (
        dir.path().join("target"),
        dir.path().join("file"),
        dir.path().join("fifo"),
        dir.path().join("spare"),
    );
    std::fs::write(&file, contents).expect("write");
    mkfifo(&fifo);
    std::fs::hard_link(&file, &path).expect("link");
    let (stop, stuck, progress) = (AtomicBool::new(false), AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for source in [&fifo, &file] {
                    let _ = std::fs::remove_file(&spare);
                    if std::fs::hard_link(source, &spare).is_ok() {
                        let _ = std::fs::rename(&spare, &path);
                    }
                }
            }
        });
        s.spawn(|| {
            let (mut seen, mut since) = (0, Instant::now());
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let now = progress.load(Ordering::Relaxed);
                if now != seen {
                    (seen, since) = (now, Instant::now());
                } else if since.elapsed() > STUCK {
                    // Succeeds only while a reader has the FIFO open: the blocked one, which this frees.
                    let flags = rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::NONBLOCK;
                    if rustix::fs::open(&fifo, flags, rustix::fs::Mode::empty()).is_ok() {
                        stuck.store(true, Ordering::Relaxed);
                    }
                }
            }
        });
        let start = Instant::now();
        while start.elapsed() < RACE && !stuck.load(Ordering::Relaxed) {
            open(&path);
            progress.fetch_add(1, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    stuck.load(Ordering::Relaxed)
}

#[test]
fn a_fifo_swapped_in_for_a_blob_never_blocks_the_open() {
    let blocked = an_open_blocks_on_a_fifo_swapped_in(b"blob bytes", |path| {
        if let Err(err) = BlobFile::open(path) {
            assert_eq!(err.to_string(), "not a regular file (it is a FIFO)");
        }
    });
    assert!(!blocked, "an open blocked on a FIFO swapped in after the file's type was checked");
}

#[test]
fn a_fifo_swapped_in_for_a_program_manifest_never_blocks_the_load() {
    let blocked = an_open_blocks_on_a_fifo_swapped_in(b"format = 1\n", |path| {
        if let Err(err) = Manifest::load(path) {
            let message = err.to_string();
            if message.contains("FIFO") {
                let fifo =
                    format!("cannot read manifest {}: not a regular file (it is a FIFO)", path.display());
                assert_eq!(message, fifo);
            }
        }
    });
    assert!(!blocked, "a manifest load blocked on a FIFO swapped in after the file's type was checked");
}

#[test]
fn a_fifo_is_named_and_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("pipe");
    mkfifo(&fifo);
    let err = BlobFile::open(&fifo).err().expect("refused");
    assert_eq!(err.to_string(), "not a regular file (it is a FIFO)");
    let err = Manifest::load(&fifo).expect_err("refused");
    assert_eq!(
        err.to_string(),
        format!("cannot read manifest {}: not a regular file (it is a FIFO)", fifo.display())
    );
    let err = host_runtime::blob_file::read_prefix(&fifo, 8).expect_err("refused");
    assert_eq!(err.to_string(), "not a regular file (it is a FIFO)");
}
