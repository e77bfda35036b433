//! The tokens file: each token's SHA-256 and role, reloaded when it changes.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: Role,
    sha256: String,
}

/// The configured tokens, by hash.
#[derive(Clone, Default)]
pub struct TokenBook {
    entries: Vec<([u8; 32], String, Role)>,
}

impl std::fmt::Debug for TokenBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(_, n, _)| n.as_str()).collect();
        f.debug_struct("TokenBook").field("names", &names).finish()
    }
}

pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenBook {
    pub fn load(path: &Path) -> Result<Self, AuthConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| AuthConfigError::Read { path: shown.clone(), source })?;
        Self::parse(&text).map_err(|problem| AuthConfigError::Invalid { path: shown, problem })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let mut entries = Vec::new();
        for (i, entry) in file.tokens.into_iter().enumerate() {
            let bytes = hex::decode(entry.sha256.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| format!("tokens[{i}] ({}): sha256 must be 64 hex digits", entry.name))?;
            if entry.name.trim().is_empty() {
                return Err(format!("tokens[{i}]: name is empty"));
            }
            entries.push((bytes, entry.name, entry.role));
        }
        Ok(Self { entries })
    }

    /// A book with one token (local mode's generated admin token).
    pub fn single(name: &str, role: Role, token: &str) -> Self {
        Self { entries: vec![(token_hash(token), name.into(), role)] }
    }

    /// The YAML line of a token, for the tokens file.
    pub fn line(name: &str, role: Role, token: &str) -> String {
        format!("  - {{name: {name}, role: {}, sha256: {}}}", role.as_str(), hex::encode(token_hash(token)))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry of `token`; every entry is compared, in constant time.
    pub(crate) fn find(&self, token: &str) -> Option<(String, Role)> {
        self.by_hash(&token_hash(token))
    }

    /// The entry whose token hashes to `presented`, compared in constant time.
    pub(crate) fn by_hash(&self, presented: &[u8; 32]) -> Option<(String, Role)> {
        let mut found = None;
        for (hash, name, role) in &self.entries {
            if bool::from(hash.ct_eq(presented)) {
                found = Some((name.clone(), *role));
            }
        }
        found
    }
}

/// The tokens in force: a fixed book, or the tokens file reloaded when it
/// changes (module doc).
#[derive(Debug)]
pub struct Tokens {
    path: Option<PathBuf>,
    check_every: Duration,
    state: Mutex<TokensState>,
}

#[derive(Debug)]
struct TokensState {
    book: Arc<TokenBook>,
    /// The file's modification time and length when it was read.
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

impl Tokens {
    /// Always `book`.
    pub fn fixed(book: TokenBook) -> Self {
        let state = TokensState { book: Arc::new(book), stamp: None, checked: Instant::now() };
        Self { path: None, check_every: Duration::MAX, state: Mutex::new(state) }
    }

    /// The tokens file at `path`, looked at again at most every
    /// `check_every`; reading it now must succeed.
    pub fn watch(path: &Path, check_every: Duration) -> Result<Self, AuthConfigError> {
        let stamp = stamp_of(path);
        let book = TokenBook::load(path)?;
        let state = TokensState { book: Arc::new(book), stamp, checked: Instant::now() };
        Ok(Self { path: Some(path.to_path_buf()), check_every, state: Mutex::new(state) })
    }

    /// The book in force, reloaded first when the file changed.
    pub fn current(&self) -> Arc<TokenBook> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(path) = &self.path else { return state.book.clone() };
        if state.checked.elapsed() < self.check_every {
            return state.book.clone();
        }
        state.checked = Instant::now();
        let stamp = stamp_of(path);
        if stamp != state.stamp {
            match TokenBook::load(path) {
                Ok(book) => {
                    tracing::info!(path = %path.display(), tokens = book.entries.len(), "the tokens file changed: reloaded");
                    state.book = Arc::new(book);
                    state.stamp = stamp;
                }
                Err(error) => {
                    tracing::warn!(%error, "the tokens file changed but cannot be used: the tokens last read stay in force");
                    state.stamp = stamp;
                }
            }
        }
        state.book.clone()
    }
}
