//! The host-worker protocol on the socket: the init request (JSON, with the memory files as descriptors), an
//! answer's encoding and the host's check of it, length-prefixed frames, and reads and writes bounded by a
//! deadline. An `execute` itself travels on the doorbell ([`bell`](super::bell)); the socket carries init and
//! a failure's message.

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Instant;

use delegate_abi::{DelegateError, ErrorCode, ExecStats};
use serde::{Deserialize, Serialize};

/// Most memory files one call's arguments may live in.
pub(super) const MAX_REGIONS: usize = 64;

/// Largest message either side accepts (the init request: paths and argument descriptions; an answer).
pub(super) const MAX_MESSAGE: u32 = 1 << 20;

/// Longest error message a worker sends: a longer one is cut here and says how many bytes were left out.
pub const MAX_ERROR_TEXT: usize = 512 * 1024;
const _: () =
    assert!(MAX_ERROR_TEXT + 64 <= MAX_MESSAGE as usize, "a cut message and its note fit a message");

/// One argument as the worker rebuilds it: where its bytes are in the shared memory files, and its metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ArgDesc {
    /// Which of the init request's regions holds its bytes.
    pub(super) region: usize,
    /// Where its bytes start in that region.
    pub(super) offset: u64,
    pub(super) nbytes: u64,
    /// A [`DTypeCode`](delegate_abi::DTypeCode)'s value, checked by the worker.
    pub(super) dtype: u8,
    pub(super) flags: u32,
    pub(super) dims: Vec<i64>,
}

/// Where one region of a call's memory is: a host memory file (travelling with the message, in order) or a
/// device allocation's CUDA IPC handle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RegionDesc {
    pub(super) len: u64,
    /// `(device ordinal, IPC handle)` for device memory; `None` for a host memory file.
    pub(super) device: Option<(i32, Vec<u8>)>,
}

/// The version of the host-worker protocol. A worker is normally the host's own binary, but a library user
/// may name another program: one built from another version says so instead of misreading the message.
/// 2: `execute` rings the doorbell ([`bell`](super::bell)), whose memory file travels last with init.
pub(super) const PROTOCOL: u32 = 2;

/// The first message to a worker; the blob's and the host regions' memory files travel with it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct InitRequest {
    /// [`PROTOCOL`]; absent (0) from hosts before the doorbell.
    #[serde(default)]
    pub(super) protocol: u32,
    /// The plugin library the worker loads.
    pub(super) library: PathBuf,
    /// The blob's size: its memory file travels first.
    pub(super) blob_len: u64,
    pub(super) regions: Vec<RegionDesc>,
    pub(super) args: Vec<ArgDesc>,
}

const REPLY_OK: u8 = 0;
const REPLY_ERR: u8 = 1;

/// A worker's answer on the socket, as the host reads it.
#[derive(Debug)]
pub(super) enum Answer {
    /// Success: init's only answer on the socket (an `execute` succeeds on the doorbell).
    Ok,
    /// Failure, with its code passed through the ABI boundary's rule.
    Err(DelegateError),
}

/// Decodes one answer: `REPLY_OK` and two `u64` counters (unused: an `execute`'s travel on the doorbell), or
/// `REPLY_ERR`, a `u32` code and the message; `None` for anything else. The code is checked exactly as the ABI
/// boundary checks a plugin's
/// ([`RError::into_delegate`](delegate_abi::abi::RError::into_delegate)): one that is no error's code
/// (`Ok`) becomes `Internal`, and the message says what the worker sent.
pub(super) fn parse_answer(reply: &[u8]) -> Option<Answer> {
    match reply.split_first()? {
        (&REPLY_OK, rest) => (rest.len() == 16).then_some(Answer::Ok),
        (&REPLY_ERR, rest) => {
            let (code, text) = rest.split_at_checked(4)?;
            let sent = ErrorCode::from_u32(u32::from_le_bytes(code.try_into().ok()?));
            let message = String::from_utf8_lossy(text).into_owned();
            let err =
                delegate_abi::abi::RError { code: sent.as_u32(), message: message.into() }.into_delegate();
            Some(Answer::Err(if err.code == sent {
                err
            } else {
                let message = format!("{} (the worker sent this error with code {sent})", err.message);
                DelegateError::new(err.code, message)
            }))
        }
        _ => None,
    }
}

/// Encodes one answer into `message` (cleared first): its length, then `REPLY_OK` and the call's two
/// counters, or `REPLY_ERR`, the error's code and its message cut at [`MAX_ERROR_TEXT`] (saying so).
pub(super) fn build_reply(
    message: &mut Vec<u8>,
    result: &Result<ExecStats, DelegateError>,
) -> io::Result<()> {
    message.clear();
    message.extend_from_slice(&[0; 4]);
    match result {
        Ok(stats) => {
            message.push(REPLY_OK);
            message.extend_from_slice(&stats.reflect_bytes.to_le_bytes());
            message.extend_from_slice(&stats.staged_bytes.to_le_bytes());
        }
        Err(err) => {
            message.push(REPLY_ERR);
            message.extend_from_slice(&err.code.as_u32().to_le_bytes());
            let text = err.message.as_str();
            let mut end = MAX_ERROR_TEXT.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            message.extend_from_slice(&text.as_bytes()[..end]);
            if end < text.len() {
                message.extend_from_slice(format!("... [truncated {} bytes]", text.len() - end).as_bytes());
            }
        }
    }
    let len = (message.len() - 4) as u32;
    message[..4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Fills `buf` from the (non-blocking) socket by `until`: `TimedOut` once it has passed, `UnexpectedEof`
/// when the worker has gone. Each wait is for what is left of the time, so a worker that sends a byte at a
/// time gains none.
pub(super) fn read_until(socket: &UnixStream, buf: &mut [u8], until: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match (&*socket).read(&mut buf[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                wait_for(socket.as_fd(), rustix::event::PollFlags::IN, Some(until))?
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Waits until `socket` is ready for `flags`, or `TimedOut` once `until` has passed (`None`: no limit).
fn wait_for(
    socket: BorrowedFd<'_>,
    flags: rustix::event::PollFlags,
    until: Option<Instant>,
) -> io::Result<()> {
    use rustix::event::{poll, PollFd, Timespec};
    let timeout = match until {
        None => None,
        Some(until) => {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            Some(Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos()),
            })
        }
    };
    let mut fds = [PollFd::new(&socket, flags)];
    match poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Writes all of `bytes` by `until` (`None`: a blocking socket, the worker's); a closed peer is an error,
/// never `SIGPIPE`.
pub(super) fn send_all(socket: BorrowedFd<'_>, mut bytes: &[u8], until: Option<Instant>) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(socket, bytes, rustix::net::SendFlags::NOSIGNAL) {
            Ok(sent) => bytes = &bytes[sent..],
            Err(rustix::io::Errno::AGAIN) => wait_for(socket, rustix::event::PollFlags::OUT, until)?,
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// One length-prefixed message, with `fds` attached to its first byte, sent by `until` (as [`send_all`]).
pub(super) fn send_frame(
    socket: BorrowedFd<'_>,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    until: Option<Instant>,
) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&len| len <= MAX_MESSAGE)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "message too large"))?;
    let header = len.to_le_bytes();
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_REGIONS + 1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"));
    }
    let sent = loop {
        match sendmsg(socket, &[io::IoSlice::new(&header)], &mut ancillary, SendFlags::NOSIGNAL) {
            Ok(sent) => break sent,
            Err(rustix::io::Errno::AGAIN) => wait_for(socket, rustix::event::PollFlags::OUT, until)?,
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    };
    send_all(socket, &header[sent..], until)?;
    send_all(socket, payload, until)
}

/// Reads one length-prefixed message and the descriptors attached to it.
pub(super) fn recv_frame(socket: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut header = [0u8; 4];
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_REGIONS + 1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let got =
        recvmsg(socket, &mut [io::IoSliceMut::new(&mut header)], &mut ancillary, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    let mut stream = UnixStream::from(socket.try_clone_to_owned()?);
    if got.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    stream.read_exact(&mut header[got.bytes..])?;
    let len = u32::from_le_bytes(header);
    if len > MAX_MESSAGE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a {len}-byte message")));
    }
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload)?;
    Ok((payload, fds))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    fn failure(message: &str) -> Vec<u8> {
        let mut reply = Vec::new();
        build_reply(&mut reply, &Err(DelegateError::invalid_argument(message))).expect("built");
        reply
    }

    #[test]
    fn an_error_message_past_the_cap_is_cut_at_a_character_and_says_how_much_was_left_out() {
        let whole = "é".repeat(MAX_ERROR_TEXT / 2);
        let reply = failure(&whole);
        let Some(Answer::Err(err)) = parse_answer(&reply[4..]) else { panic!("not a failure") };
        assert_eq!(err.message, whole, "a message at the cap arrives whole");
        let longer = format!("a{whole}");
        let reply = failure(&longer);
        let Some(Answer::Err(err)) = parse_answer(&reply[4..]) else { panic!("not a failure") };
        // The cap falls inside the last `é`: cut before it.
        assert_eq!(err.message, format!("a{}... [truncated 2 bytes]", "é".repeat(MAX_ERROR_TEXT / 2 - 1)));
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert_eq!(u32::from_le_bytes(reply[..4].try_into().expect("4 bytes")) as usize, reply.len() - 4);
    }

    #[test]
    fn a_worker_s_answer_is_checked_as_the_abi_boundary_checks_a_plugin_s() {
        let coded = |code: u32, text: &str| {
            let mut reply = vec![REPLY_ERR];
            reply.extend_from_slice(&code.to_le_bytes());
            reply.extend_from_slice(text.as_bytes());
            match parse_answer(&reply) {
                Some(Answer::Err(err)) => err,
                other => panic!("{other:?}"),
            }
        };
        let err = coded(0, "says Ok");
        assert_eq!(err.code, ErrorCode::Internal);
        assert_eq!(err.message, "says Ok (the worker sent this error with code Ok (0x00))");
        let err = coded(ErrorCode::NotFound.as_u32(), "gone");
        assert_eq!((err.code, err.message.as_str()), (ErrorCode::NotFound, "gone"));
        // A code this build does not know crosses as the ABI boundary lets it: `Unknown`, with its value.
        assert_eq!(coded(0x77, "?").code, ErrorCode::Unknown(0x77));
        assert!(matches!(parse_answer(&[REPLY_OK; 17]), Some(Answer::Ok)));
        for malformed in [&[][..], &[REPLY_OK; 5], &[REPLY_ERR, 1, 0], &[7, 0, 0, 0, 0]] {
            assert!(parse_answer(malformed).is_none(), "{malformed:?}");
        }
    }

    #[test]
    fn a_read_ends_at_its_deadline_however_the_bytes_trickle_in() {
        let (host, worker) = UnixStream::pair().expect("a socket pair");
        host.set_nonblocking(true).expect("non-blocking");
        let trickle = std::thread::spawn(move || {
            let mut worker = worker;
            // A byte every 20 ms for about 2 s, much longer than the read may take.
            for _ in 0..100 {
                if worker.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let start = Instant::now();
        let mut buf = [0u8; 1000];
        let err = read_until(&host, &mut buf, start + Duration::from_millis(200)).expect_err("a trickle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_millis(1000), "{:?}", start.elapsed());
        drop(host);
        trickle.join().expect("the trickling thread");
    }
}
