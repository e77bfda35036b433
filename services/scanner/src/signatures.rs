//! A JukeBox's signature policy as the scanner applies it (`spec.verify`,
//! `docs/scanner.md` "Signatures"): its trusted keys, inline and from the
//! Secret it names, its identities and the trusted root's ConfigMap or Secret (read
//! afresh at each scan, as pull secrets, so a rotated key counts at once). The verdicts are the rules' and the registry
//! client's (`vynil_registry`'s `signature_verdict`); the engine records
//! them on each revision.

use std::sync::Arc;

use vynil_crds::{TrustedRootObject, TrustedRootSource, coded_message};
use vynil_rules::signature::{Keyring, VerifyMode};

use vynil_store::{JukeboxRecord, ScannerStore};

/// A JukeBox's signature policy, its keys read.
#[derive(Debug, Clone)]
pub struct Verification {
    pub mode: VerifyMode,
    pub keys: Arc<Keyring>,
    /// `spec.verify.requireReference` (`Verdict::bound_to`).
    pub require_reference: bool,
}

impl Verification {
    pub fn enforced(&self) -> bool {
        self.mode == VerifyMode::Enforce
    }
}

/// Why a JukeBox's signature policy cannot be used.
#[derive(Debug)]
pub enum Unusable {
    /// An object it names (its keys' Secret, its trusted root's ConfigMap
    /// or Secret) cannot be read, or may not be named: `what` says which.
    Unreadable { what: String, error: vynil_store::StoreError },
    /// Its keys are not keys (`[E_VERIFY_KEYS] …`).
    Keys(String),
}

/// The signature policy of `record`; `None` without one. Keys that cannot
/// be read fail the scan (the catalog is kept), saying which and why; a
/// keys' Secret the JukeBox may not name refuses it.
pub async fn policy_of(
    record: &JukeboxRecord,
    store: &dyn ScannerStore,
) -> Result<Option<Verification>, Unusable> {
    let Some(policy) = &record.spec.verify else { return Ok(None) };
    let secret = read(policy.keys_secret.as_deref(), "the trusted keys' Secret", store).await?;
    let root = match policy.trusted_root.as_ref().map(TrustedRootSource::object).transpose() {
        Ok(Some(TrustedRootObject::Secret(name))) => {
            read(Some(name), "the trusted root's Secret", store).await?
        }
        Ok(Some(TrustedRootObject::ConfigMap(name))) => {
            Some(store.config_map(name).await.map_err(|error| Unusable::Unreadable {
                what: format!("the trusted root's ConfigMap {name:?}"),
                error,
            })?)
        }
        Ok(None) => None,
        Err(e) => return Err(Unusable::Keys(coded_message("E_VERIFY_KEYS", &e.to_string()))),
    };
    let keys = policy
        .keyring(secret.as_ref().map(|s| &s.data), root.as_ref().map(|s| &s.data))
        .map_err(|e| Unusable::Keys(coded_message("E_VERIFY_KEYS", &e.to_string())))?;
    Ok(Some(Verification {
        mode: policy.mode(),
        keys: Arc::new(keys),
        require_reference: policy.require_reference,
    }))
}

/// The Secret a policy names as `what`, if it names one.
async fn read(
    name: Option<&str>,
    what: &str,
    store: &dyn ScannerStore,
) -> Result<Option<vynil_crds::secrets::NamedSecret>, Unusable> {
    let Some(name) = name.filter(|s| !s.is_empty()) else { return Ok(None) };
    let unreadable = |error| Unusable::Unreadable { what: format!("{what} {name:?}"), error };
    store.secret(name).await.map(Some).map_err(unreadable)
}
