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

/// Reads `path` as the bytes of input `decl` of `method`, refusing any other dtype, order or shape.
pub fn read_input(method: &str, decl: &TensorDecl, path: &Path) -> Result<Vec<u8>, Error> {
    let name = &decl.name;
    let read = |source| Error::Read { name: name.clone(), path: path.to_owned(), source };
    let expected_type = type_str(decl.dtype).ok_or_else(|| Error::DType {
        what: format!("input '{name}' of method '{method}'"),
        dtype: decl.dtype.to_string(),
    })?;
    let file = std::fs::File::open(path).map_err(read)?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file)).map_err(read)?;
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
    let len = usize::try_from(decl.nbytes()).unwrap_or(usize::MAX);
    let mut bytes = vec![0u8; len];
    npy.into_inner().read_exact(&mut bytes).map_err(read)?;
    Ok(bytes)
}

/// Writes `bytes` (a tensor `decl`) to `path` as a `.npy` file.
pub fn write(path: &Path, what: &str, decl: &TensorDecl, bytes: &[u8]) -> Result<(), Error> {
    let ts = type_str(decl.dtype)
        .ok_or_else(|| Error::DType { what: what.to_owned(), dtype: decl.dtype.to_string() })?;
    let write_error = |source| Error::Write { path: path.to_owned(), source };
    let dtype = npyz::DType::Plain(ts.parse().expect("a valid type string"));
    let file = std::fs::File::create(path).map_err(write_error)?;
    let mut out = npyz::WriteOptions::new_header_only()
        .dtype(dtype)
        .shape(&decl.shape)
        .writer(std::io::BufWriter::new(file))
        .write_header_only()
        .map_err(write_error)?;
    out.write_all(bytes).and_then(|()| out.flush()).map_err(write_error)
}
