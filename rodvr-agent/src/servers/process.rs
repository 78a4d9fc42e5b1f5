//! Starting one server process, and telling whether a process is still the one started.
//!
//! A server runs as `unshare --pid --fork --kill-child --mount-proc -- setpriv --reuid U --regid G
//! --clear-groups --no-new-privs --inh-caps=-all -- COMMAND...` (util-linux): PID 1 of a PID
//! namespace of its own, with its own `/proc`, so it sees and can signal no other server's
//! processes; an unprivileged user with no capabilities and no way to gain any. Between the
//! fork and the exec the new process (still the agent's, as root) joins the server's cgroups, so
//! everything it starts is in them from its first instruction; leaves the agent's session, so a
//! signal to the agent's process group does not reach it and it outlives an agent that is killed
//! (the next agent adopts or ends it); and marks every descriptor but its standard streams and
//! its own share state to close at exec, so it inherits nothing else of the agent's (another
//! server's share state, the agent's sockets). Its environment is exactly what the agent gives.
//!
//! This is the one module of the agent with `unsafe` code: the steps between fork and exec must
//! be raw system calls (`CommandExt::pre_exec`).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// How to start one server.
#[derive(Debug)]
pub struct Launch<'a> {
    pub unshare: &'a Path,
    pub setpriv: &'a Path,
    pub uid: u32,
    pub gid: u32,
    pub command: &'a [String],
    /// The whole environment the server gets.
    pub env: Vec<(String, String)>,
    /// The `cgroup.procs` files of the server's cgroups.
    pub cgroup_procs: Vec<PathBuf>,
    /// Its share state, inherited (its number is in `GSAAS_SHARE_FD`).
    pub share: &'a File,
    /// Where its output goes.
    pub log: &'a File,
}

/// Starts the server; returns the process (the `unshare` that holds its namespace) and its PID.
pub fn spawn(launch: &Launch<'_>) -> io::Result<Child> {
    let mut command = Command::new(launch.unshare);
    command
        .args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"])
        .arg(launch.setpriv)
        .arg(format!("--reuid={}", launch.uid))
        .arg(format!("--regid={}", launch.gid))
        .args(["--clear-groups", "--no-new-privs", "--inh-caps=-all", "--"])
        .args(launch.command)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(launch.log.try_clone()?)
        .stderr(launch.log.try_clone()?);
    let procs: Vec<CString> = launch
        .cgroup_procs
        .iter()
        .map(|p| CString::new(p.as_os_str().as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a cgroup path holds a NUL"))?;
    let share_fd = launch.share.as_raw_fd();
    // SAFETY: the closure runs in the child between fork and exec, and makes only
    // async-signal-safe system calls (setsid, open, write, close, fcntl, close_range) on
    // memory prepared before the fork; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            for path in &procs {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            // Everything above the standard streams closes at exec, but the share state.
            if share_fd < 3 {
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            }
            let cloexec = libc::CLOSE_RANGE_CLOEXEC as libc::c_uint;
            if share_fd > 3
                && libc::syscall(libc::SYS_close_range, 3u32, (share_fd - 1) as u32, cloexec) < 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_close_range, (share_fd + 1) as u32, u32::MAX, cloexec) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::fcntl(share_fd, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// A process's start time (field 22 of `/proc/PID/stat`, in clock ticks since boot) while it
/// runs; `None` once it is gone (or only a zombie). With the PID it names one process for good:
/// a PID reused later has another start time.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `PID (COMM) STATE ...`: COMM may hold spaces and parentheses, so read after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // Fields 4.. follow the state (field 3); the start time is field 22.
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_has_a_start_time_and_a_gone_one_none() {
        let me = std::process::id();
        let mine = start_time(me).expect("this process runs");
        assert_eq!(start_time(me), Some(mine), "stable");
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(start_time(pid), None);
    }
}
