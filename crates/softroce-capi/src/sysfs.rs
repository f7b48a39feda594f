//! libibverbs' sysfs helpers: `ibv_get_sysfs_path` (the sysfs root, `$SYSFS_PATH` or
//! `/sys`, which `ibv_device`'s `dev_path` and `ibdev_path` start with) and
//! `ibv_read_sysfs_file` (one `read` of a file under a directory, its trailing newline cut).
//! Source: rdma-core 44 libibverbs/sysfs.c. Open MPI's openib BTL, for one, gives up on a
//! host whose `<ibv_get_sysfs_path()>/class/infiniband` is not a directory
//! (`opal_common_verbs_check_basics`); `softroce exec` makes that directory.

use core::ffi::{CStr, c_char, c_int};
use softroce_cabi::abi::IBV_SYSFS_PATH_MAX;
use softroce_cabi::ffi;
use std::ffi::CString;
use std::os::unix::ffi::OsStringExt;
use std::sync::OnceLock;

/// The environment variable that moves the sysfs root (rdma-core's; honoured only when the
/// process is not set-user-ID, as there).
pub const SYSFS_PATH: &str = "SYSFS_PATH";

/// The sysfs root, chosen once per process: `$SYSFS_PATH` (its first 256 bytes, trailing
/// slashes cut) when the real and effective user IDs agree and it is set, else `/sys`.
pub(crate) fn sysfs_path() -> &'static CStr {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| {
        // SAFETY: getuid and geteuid have no preconditions and cannot fail.
        let same_user = unsafe { libc::getuid() == libc::geteuid() };
        let env = if same_user {
            std::env::var_os(SYSFS_PATH)
        } else {
            None
        };
        match env {
            Some(v) => sysfs_root(v.into_vec()),
            None => c"/sys".to_owned(),
        }
    })
}

/// `$SYSFS_PATH`'s value as rdma-core keeps it: `strndup(env, IBV_SYSFS_PATH_MAX)`, then
/// every trailing `/` removed (so `/` becomes the empty string).
fn sysfs_root(mut v: Vec<u8>) -> CString {
    v.truncate(IBV_SYSFS_PATH_MAX);
    while v.last() == Some(&b'/') {
        v.pop();
    }
    // An environment variable's value holds no NUL byte.
    CString::new(v).unwrap_or_default()
}

pub(crate) extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    ffi!({ sysfs_path().as_ptr() })
}

/// `%s` of a C string as glibc's `asprintf` prints it: `(null)` for NULL.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn c_text(s: *const c_char) -> Vec<u8> {
    if s.is_null() {
        return b"(null)".to_vec();
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_bytes().to_vec()
}

/// Reads `<dir>/<file>` with one `read` of at most `size` bytes into `buf`: the length
/// read (a trailing newline replaced by NUL and not counted; otherwise NUL-terminated when
/// there is room), 0 for an empty file, or -1 with errno (`open`'s or `read`'s) when the
/// file cannot be read. Contents that fill `buf` with no newline at the end are -1 too, with
/// errno left as it was (rdma-core: they could not be NUL-terminated).
pub(crate) extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    ffi!({
        // SAFETY: the caller passes NUL-terminated strings (NULL prints as "(null)", as
        // rdma-core's asprintf prints it).
        let mut path = unsafe { c_text(dir) };
        path.push(b'/');
        // SAFETY: as above.
        path.extend(unsafe { c_text(file) });
        let path = CString::new(path).map_err(|_| libc::EINVAL)?;
        read_file(&path, buf, size)
    })
}

/// rdma-core's `ibv_read_sysfs_file_at(AT_FDCWD, path, buf, size)`; `Ok(-1)` is -1 with
/// the errno the failed call set (or none, for contents too long to terminate).
fn read_file(path: &CStr, buf: *mut c_char, size: usize) -> Result<c_int, c_int> {
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Ok(-1);
    }
    // SAFETY: the caller passes a buffer of `size` writable bytes; `fd` is open.
    let len = unsafe { libc::read(fd, buf.cast(), size) };
    let read_errno = softroce_cabi::errno();
    // SAFETY: `fd` is ours and open.
    unsafe { libc::close(fd) };
    if len < 0 {
        softroce_cabi::set_errno(read_errno);
        return Ok(-1);
    }
    let mut len = len as usize;
    if len > 0 {
        // SAFETY: `len` <= `size` bytes of `buf` were written by read; every index below is
        // inside `buf`.
        unsafe {
            if *buf.add(len - 1) == b'\n' as c_char {
                len -= 1;
                *buf.add(len) = 0;
            } else if len < size {
                *buf.add(len) = 0;
            } else {
                return Ok(-1);
            }
        }
    }
    Ok(len as c_int)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_root_cuts_trailing_slashes_and_length() {
        assert_eq!(sysfs_root(b"/tmp/sys//".to_vec()).as_bytes(), b"/tmp/sys");
        assert_eq!(sysfs_root(b"/".to_vec()).as_bytes(), b"");
        let long = vec![b'a'; IBV_SYSFS_PATH_MAX + 10];
        assert_eq!(sysfs_root(long).as_bytes().len(), IBV_SYSFS_PATH_MAX);
    }

    /// A scratch directory with the files of the cases below.
    fn scratch() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("softroce-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("nl"), "0xffffff\n").unwrap();
        std::fs::write(d.join("plain"), "rxe").unwrap();
        std::fs::write(d.join("empty"), "").unwrap();
        d
    }

    fn read(dir: &std::path::Path, file: &str, size: usize) -> (c_int, Vec<u8>, i32) {
        let dir = CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        let file = CString::new(file).unwrap();
        let mut buf = vec![0x55 as c_char; size.max(1)];
        softroce_cabi::set_errno(0);
        let r = ibv_read_sysfs_file(dir.as_ptr(), file.as_ptr(), buf.as_mut_ptr(), size);
        let e = softroce_cabi::errno();
        (r, buf.iter().map(|&c| c as u8).collect(), e)
    }

    #[test]
    fn read_sysfs_file_as_rdma_core() {
        let d = scratch();
        // A trailing newline becomes the NUL and is not counted.
        let (r, buf, _) = read(&d, "nl", 64);
        assert_eq!((r, &buf[..9]), (8, &b"0xffffff\0"[..]));
        // No newline: NUL-terminated after the contents.
        let (r, buf, _) = read(&d, "plain", 64);
        assert_eq!((r, &buf[..4]), (3, &b"rxe\0"[..]));
        // Contents that fill the buffer with no newline cannot be terminated: -1.
        let (r, buf, _) = read(&d, "plain", 3);
        assert_eq!((r, &buf[..3]), (-1, &b"rxe"[..]));
        // Newline as the last byte that fits: cut, the buffer is exactly full.
        let (r, buf, _) = read(&d, "nl", 9);
        assert_eq!((r, &buf[..9]), (8, &b"0xffffff\0"[..]));
        // Empty: 0, the buffer untouched.
        let (r, buf, _) = read(&d, "empty", 4);
        assert_eq!((r, buf[0]), (0, 0x55));
        // Missing: -1 with open's errno.
        assert_eq!(read(&d, "missing", 4).0, -1);
        assert_eq!(read(&d, "missing", 4).2, libc::ENOENT);
        let _ = std::fs::remove_dir_all(&d);
    }
}
