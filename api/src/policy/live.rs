//! The rules in force while gsaasd runs: the policy file is read again when it changes (checked
//! every `auth.policy_reload_secs`) and on SIGHUP, as oslo.policy rereads its file. A file that
//! does not parse, or names a rule twice, or otherwise fails [`Policy::parse`], changes nothing:
//! the rules read last stay in force, and the problem is reported until the file is fixed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::{Action, Policy, PolicyError, Target};
use crate::caller::Caller;
use crate::error::Error;

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The file is as it was read last.
    Unchanged,
    /// The file changed and its rules are now in force.
    Applied,
}

/// Why a reload kept the rules in force: the file's problem, and whether this reload found it
/// (the file changed) or an earlier one did.
#[derive(Debug)]
pub struct Kept {
    pub problem: PolicyError,
    pub new: bool,
}

/// The rules in force, and the policy file they came from. See the module docs.
#[derive(Debug)]
pub struct LivePolicy {
    current: RwLock<Arc<Policy>>,
    path: Option<PathBuf>,
    /// The file's text as read last (whether or not it was valid), and its problem if any.
    last_read: Mutex<(Option<String>, Option<String>)>,
}

impl LivePolicy {
    /// Reads the file (if any) for the first time: an invalid one is an error, as at start.
    pub fn load(path: Option<&Path>) -> Result<LivePolicy, PolicyError> {
        let (policy, text) = match path {
            None => (Policy::default(), None),
            Some(path) => {
                let text = read(path)?;
                (Policy::parse(&text, path)?, Some(text))
            }
        };
        Ok(LivePolicy {
            current: RwLock::new(Arc::new(policy)),
            path: path.map(Path::to_owned),
            last_read: Mutex::new((text, None)),
        })
    }

    /// The rules in force now.
    pub fn current(&self) -> Arc<Policy> {
        Arc::clone(&self.current.read().expect("policy in force"))
    }

    /// The policy file, if the configuration names one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Reads the file again and puts its rules in force if it changed and is valid; otherwise
    /// keeps the rules in force and says why.
    pub fn reload(&self) -> Result<Reload, Kept> {
        let Some(path) = &self.path else { return Ok(Reload::Unchanged) };
        let mut last_read = self.last_read.lock().expect("policy file read last");
        let text = match read(path) {
            Ok(text) => text,
            Err(problem) => {
                let message = problem.to_string();
                let new = last_read.1.as_deref() != Some(message.as_str());
                *last_read = (None, Some(message));
                return Err(Kept { problem, new });
            }
        };
        if last_read.0.as_deref() == Some(text.as_str()) {
            return match &last_read.1 {
                None => Ok(Reload::Unchanged),
                Some(_) => Err(Kept {
                    problem: Policy::parse(&text, path).expect_err("an invalid file stays invalid"),
                    new: false,
                }),
            };
        }
        match Policy::parse(&text, path) {
            Ok(policy) => {
                *self.current.write().expect("policy in force") = Arc::new(policy);
                *last_read = (Some(text), None);
                Ok(Reload::Applied)
            }
            Err(problem) => {
                *last_read = (Some(text), Some(problem.to_string()));
                Err(Kept { problem, new: true })
            }
        }
    }

    /// [`Policy::allows`] under the rules in force.
    pub fn allows(&self, action: Action, caller: &Caller, target: Target<'_>) -> bool {
        self.current().allows(action, caller, target)
    }

    /// [`Policy::authorize`] under the rules in force.
    pub fn authorize(
        &self,
        action: Action,
        caller: &Caller,
        target: Target<'_>,
    ) -> Result<(), Error> {
        self.current().authorize(action, caller, target)
    }

    /// [`Policy::list_scope`] under the rules in force.
    pub fn list_scope<'c>(
        &self,
        caller: &'c Caller,
        own: Action,
        all: Action,
    ) -> Result<Option<&'c str>, Error> {
        self.current().list_scope(caller, own, all)
    }
}

fn read(path: &Path) -> Result<String, PolicyError> {
    std::fs::read_to_string(path)
        .map_err(|source| PolicyError::Read { path: path.to_owned(), source })
}
