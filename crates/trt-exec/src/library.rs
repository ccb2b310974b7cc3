//! Finding and loading the TensorRT-RTX library (dlopen), once per process.
//!
//! Order: the path in [`LIB_ENV`] (`KV_TENSORRT_LIB`), then the standard loader path under the names
//! [`LOADER_NAMES`]. The library is never unloaded (TensorRT objects and thread-locals may outlive any handle).

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Environment variable holding the full path of `libtensorrt_rtx.so.1`; `cargo xtask test` sets it.
pub const LIB_ENV: &str = "KV_TENSORRT_LIB";

/// The library path [`LIB_ENV`] names, or `None` when it is unset; for callers (and tests) that need the
/// configured library rather than whatever the loader path finds.
pub fn configured_path() -> Option<PathBuf> {
    std::env::var_os(LIB_ENV).map(PathBuf::from)
}

/// What to tell a person when [`configured_path`] is `None`.
pub const NOT_CONFIGURED: &str = "KV_TENSORRT_LIB is not set: point it at libtensorrt_rtx.so.1 \
                                  (`cargo xtask test` installs the wheel into .cache/tensorrt and sets it)";

/// Names tried on the standard loader path (`LD_LIBRARY_PATH`, ld.so.cache) when [`LIB_ENV`] is unset.
pub const LOADER_NAMES: [&str; 3] =
    ["libtensorrt_rtx.so.1", "libtensorrt_rtx.so.1.7.1", "libtensorrt_rtx.so"];

/// The loaded TensorRT-RTX library.
#[derive(Debug)]
pub struct Library {
    /// The path or loader name it was loaded from.
    pub source: PathBuf,
    /// Its version as the library itself reports it.
    pub version: LibraryVersion,
    lib: libloading::Library,
}

/// A library version (`getInferLibMajorVersion` and friends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct LibraryVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
    /// Build.
    pub build: u32,
}

impl LibraryVersion {
    /// `"TensorRT-RTX 1.7.1.116"`, as recorded in blob headers (`engine_library_version`).
    pub fn describe(&self) -> String {
        format!("TensorRT-RTX {}.{}.{}.{}", self.major, self.minor, self.patch, self.build)
    }

    /// Whether this library has `IKVCacheUpdateLayer` and `getAliasedInputTensor` (TensorRT-RTX 1.7+).
    pub fn reports_aliases(&self) -> bool {
        (self.major, self.minor) >= (1, 7)
    }
}

static LOADED: OnceLock<std::result::Result<Library, (String, String)>> = OnceLock::new();

/// Loads the library (first call) and returns it; later calls return the same library or the same error.
pub fn load() -> Result<&'static Library> {
    let loaded = LOADED.get_or_init(load_uncached);
    match loaded {
        Ok(lib) => Ok(lib),
        Err((tried, message)) => {
            Err(Error::LibraryNotFound { tried: tried.clone(), message: message.clone() })
        }
    }
}

fn load_uncached() -> std::result::Result<Library, (String, String)> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os(LIB_ENV).filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(path));
    }
    candidates.extend(LOADER_NAMES.iter().map(PathBuf::from));
    let mut tried = Vec::new();
    let mut last = String::from("no candidate");
    for candidate in candidates {
        tried.push(candidate.display().to_string());
        let (lib, version) = match open(&candidate) {
            Ok(opened) => opened,
            Err(message) => {
                last = message;
                continue;
            }
        };
        // trtx keeps its own handle to the same library (dlopen of the same path returns the same handle).
        if let Err(err) = trtx::dynamically_load_tensorrt(Some(candidate.as_os_str())) {
            last = format!("{}: {}", candidate.display(), chain(&err));
            continue;
        }
        tracing::debug!(source = %candidate.display(), version = %version.describe(), "loaded TensorRT-RTX");
        return Ok(Library { source: candidate, version, lib });
    }
    Err((tried.join(", "), last))
}

/// An error with its sources (libloading puts the loader's own message in the source).
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// Opens `candidate` and reads its version.
fn open(candidate: &Path) -> std::result::Result<(libloading::Library, LibraryVersion), String> {
    // SAFETY: loading TensorRT-RTX runs its static initialisers, which have no preconditions; a library kept
    // by `load` lives in a static for the rest of the process, so no symbol outlives it.
    let lib = unsafe { libloading::Library::new(candidate) }.map_err(|e| chain(&e))?;
    let version = read_version(&lib).map_err(|e| format!("{}: {}", candidate.display(), chain(&e)))?;
    Ok((lib, version))
}

/// Opens the library at `path` without keeping it and reports its version: a check for setup tools
/// (`delegate-host plugins`, `cargo xtask`), independent of the process-wide [`load`].
///
/// # Errors
/// [`Error::LibraryNotFound`] with the loader's message when `path` is not a loadable TensorRT library.
pub fn probe(path: &Path) -> Result<LibraryVersion> {
    open(path)
        .map(|(_, version)| version)
        .map_err(|message| Error::LibraryNotFound { tried: path.display().to_string(), message })
}

fn read_version(lib: &libloading::Library) -> std::result::Result<LibraryVersion, libloading::Error> {
    type VersionFn = unsafe extern "C" fn() -> i32;
    let get = |name: &[u8]| -> std::result::Result<u32, libloading::Error> {
        // SAFETY: `getInferLib*Version` are exported `extern "C" int32_t f()` functions of every TensorRT(-RTX)
        // library (NvInferRuntime.h); calling them has no preconditions.
        let value = unsafe {
            let f: libloading::Symbol<'_, VersionFn> = lib.get(name)?;
            f()
        };
        Ok(u32::try_from(value).unwrap_or(0))
    };
    Ok(LibraryVersion {
        major: get(b"getInferLibMajorVersion\0")?,
        minor: get(b"getInferLibMinorVersion\0")?,
        patch: get(b"getInferLibPatchVersion\0")?,
        build: get(b"getInferLibBuildVersion\0")?,
    })
}

impl Library {
    /// `createInferRuntime_INTERNAL(logger, version)`: a new `IRuntime*`, or null.
    ///
    /// # Safety
    /// `logger` must be a valid `nvinfer1::ILogger*` that outlives the returned runtime.
    pub(crate) unsafe fn create_runtime(&self, logger: *mut c_void) -> Result<*mut c_void> {
        type CreateFn = unsafe extern "C" fn(*mut c_void, i32) -> *mut c_void;
        // SAFETY: the symbol has this signature in every TensorRT-RTX 1.x library (NvInferRuntime.h declares
        // `extern "C" void* createInferRuntime_INTERNAL(void* logger, int32_t version) noexcept`); `logger` is
        // valid per this function's contract; the version is the header version trtx-sys was built against.
        unsafe {
            let create: libloading::Symbol<'_, CreateFn> = self
                .lib
                .get(b"createInferRuntime_INTERNAL\0")
                .map_err(|e| Error::Trt { call: "createInferRuntime", message: e.to_string() })?;
            let version = i32::try_from(trtx_sys::get_tensorrt_version()).unwrap_or(i32::MAX);
            Ok(create(logger, version))
        }
    }
}
