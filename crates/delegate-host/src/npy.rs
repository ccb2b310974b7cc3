//! `.npy` files (NumPy's format, through `npyz`) for `run --input` and `--output-dir`: a tensor's bytes are
//! the file's data as is, so a file is accepted only when its dtype (little-endian) and shape are exactly the
//! tensor's and its order is C.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use et_error::{ErrorCode, HasErrorCode};
use host_runtime::manifest::TensorDecl;
use npyz::WriterBuilder;

/// Why an input could not be read or an output written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--input` is not `NAME=FILE` (`InvalidArgument`).
    #[error("--input '{arg}' is not NAME=FILE.npy")]
    Syntax {
        /// The argument.
        arg: String,
    },
    /// The method has no input of that name (`InvalidArgument`).
    #[error("--input {name}={path}: method '{method}' has no input '{name}' (its inputs: {inputs})")]
    UnknownInput {
        /// The name given.
        name: String,
        /// The file given.
        path: PathBuf,
        /// The method.
        method: String,
        /// Its inputs.
        inputs: String,
    },
    /// The file cannot be read (`AccessFailed`).
    #[error("--input {name}={path}: {source}")]
    Read {
        /// The input.
        name: String,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The file's dtype, order or shape is not the input's (`InvalidArgument`).
    #[error("--input {name}={path}: the file holds {found}, but input '{name}' of method '{method}' is {expected}")]
    Mismatch {
        /// The input.
        name: String,
        /// The file.
        path: PathBuf,
        /// The method.
        method: String,
        /// What the input is (`<f4 [1, 64]`).
        expected: String,
        /// What the file holds.
        found: String,
    },
    /// A tensor's element type has no `.npy` dtype (`NotSupported`).
    #[error("{what} is {dtype}, which .npy files cannot hold")]
    DType {
        /// The tensor.
        what: String,
        /// Its element type.
        dtype: String,
    },
    /// An output file cannot be written (`AccessFailed`).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::Syntax { .. } | Error::UnknownInput { .. } | Error::Mismatch { .. } => {
                ErrorCode::InvalidArgument
            }
            Error::Read { .. } | Error::Write { .. } => ErrorCode::AccessFailed,
            Error::DType { .. } => ErrorCode::NotSupported,
        }
    }
}

/// NumPy's type string of a dtype as this host stores it (little-endian), or `None` (bfloat16).
fn type_str(dtype: blob_format::model::DType) -> Option<&'static str> {
    use blob_format::model::DType as D;
    Some(match dtype {
        D::F32 => "<f4",
        D::F16 => "<f2",
        D::F64 => "<f8",
        D::I8 => "|i1",
        D::U8 => "|u1",
        D::I32 => "<i4",
        D::I64 => "<i8",
        D::Bool => "|b1",
        _ => return None,
    })
}

fn describe(type_str: &str, shape: &[u64], fortran: bool) -> String {
    format!("{type_str} {shape:?}{}", if fortran { " (Fortran order)" } else { "" })
}

/// `NAME=FILE` of one `--input`.
pub fn split(arg: &str) -> Result<(String, PathBuf), Error> {
    match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_owned(), PathBuf::from(path)))
        }
        _ => Err(Error::Syntax { arg: arg.to_owned() }),
    }
}

/// The most bytes a `.npy` header may take after its preamble (NumPy's own reader refuses more than 10 000).
const MAX_HEADER_BYTES: u32 = 1 << 16;

/// The magic string that opens every `.npy` file.
const MAGIC: &[u8] = b"\x93NUMPY";

/// The header length a `.npy` preamble (magic, version, length) states, when `preamble` is one: a `u16`
/// after version 1, a `u32` after versions 2 and 3.
fn header_len(preamble: &[u8]) -> Option<u32> {
    let rest = preamble.strip_prefix(MAGIC)?;
    match *rest {
        [1, _, a, b, ..] => Some(u32::from(u16::from_le_bytes([a, b]))),
        [2 | 3, _, a, b, c, d, ..] => Some(u32::from_le_bytes([a, b, c, d])),
        _ => None,
    }
}

/// Reads `path` as the bytes of input `decl` of `method`, refusing any other dtype, order or shape.
///
/// The file is opened once, non-blocking, and refused unless it is a regular file
/// (`host_runtime::blob_file::open_regular`: a FIFO cannot block the open, a device cannot stream without
/// end), and no more is ever read than a header of at most [`MAX_HEADER_BYTES`] and the input's bytes.
pub fn read_input(method: &str, decl: &TensorDecl, path: &Path) -> Result<Vec<u8>, Error> {
    let name = &decl.name;
    let read = |source| Error::Read { name: name.clone(), path: path.to_owned(), source };
    let expected_type = type_str(decl.dtype).ok_or_else(|| Error::DType {
        what: format!("input '{name}' of method '{method}'"),
        dtype: decl.dtype.to_string(),
    })?;
    let len = decl.nbytes();
    let file = host_runtime::blob_file::open_regular(path).map_err(read)?;
    // The preamble's 12 bytes at most, the header, the data: nothing past them is read.
    let mut file = file.take(12 + u64::from(MAX_HEADER_BYTES) + len);
    let mut preamble = Vec::with_capacity(12);
    (&mut file).take(12).read_to_end(&mut preamble).map_err(read)?;
    // Refused before npyz allocates it; a file that is no .npy is left to npyz to name.
    let header = header_len(&preamble).unwrap_or(0);
    if header > MAX_HEADER_BYTES {
        return Err(read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("its .npy header is {header} bytes, more than the {MAX_HEADER_BYTES} this host reads"),
        )));
    }
    let npy = npyz::NpyFile::new(std::io::BufReader::new(std::io::Cursor::new(preamble).chain(file)))
        .map_err(read)?;
    let found_type = match npy.dtype() {
        npyz::DType::Plain(ts) => ts.to_string(),
        other => other.descr(),
    };
    let shape = npy.shape().to_vec();
    let fortran = matches!(npy.order(), npyz::Order::Fortran) && shape.iter().filter(|&&d| d > 1).count() > 1;
    if found_type != expected_type || shape != decl.shape || fortran {
        return Err(Error::Mismatch {
            name: name.clone(),
            path: path.to_owned(),
            method: method.to_owned(),
            expected: describe(expected_type, &decl.shape, false),
            found: describe(&found_type, &shape, fortran),
        });
    }
    // The input's own size, which the program already holds: read into a fallible allocation all the same.
    let mut bytes = Vec::new();
    usize::try_from(len).ok().and_then(|len| bytes.try_reserve_exact(len).ok()).ok_or_else(|| {
        read(std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("cannot allocate {len} bytes")))
    })?;
    npy.into_inner().take(len).read_to_end(&mut bytes).map_err(read)?;
    if bytes.len() as u64 != len {
        return Err(read(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the file ends after {} of the input's {len} bytes", bytes.len()),
        )));
    }
    Ok(bytes)
}

/// Writes `bytes` (a tensor `decl`) to `path` as a `.npy` file, refusing a path where something other than a
/// regular file is (a FIFO, a device, a symbolic link: [`crate::out_file::refuse_special`]) and writing
/// through a temporary file ([`crate::out_file::replace`]), so nothing there is opened or written through
/// and a failed write leaves an existing file whole.
pub fn write(path: &Path, what: &str, decl: &TensorDecl, bytes: &[u8]) -> Result<(), Error> {
    let ts = type_str(decl.dtype)
        .ok_or_else(|| Error::DType { what: what.to_owned(), dtype: decl.dtype.to_string() })?;
    let write_error = |source| Error::Write { path: path.to_owned(), source };
    let dtype = npyz::DType::Plain(ts.parse().expect("a valid type string"));
    crate::out_file::refuse_special(path).map_err(write_error)?;
    crate::out_file::replace(path, |file| {
        let options = npyz::WriteOptions::new_header_only().dtype(dtype).shape(&decl.shape);
        options.writer(file).write_header_only()?.write_all(bytes)
    })
    .map_err(write_error)
}
