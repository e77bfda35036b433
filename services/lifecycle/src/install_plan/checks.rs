//! The gates that read what was observed of the revision itself: the
//! catalog's answer, the options against its schema, `initFrom.version`,
//! its requirements and its controller values. Each passes, or answers the
//! plan itself.

use super::*;

/// The package the catalog selected, and the pull secret of its JukeBox.
pub(super) fn resolved<'a>(
    instance: &Instance,
    observed: &'a Observed,
) -> Result<(&'a Package, &'a Option<String>), Plan> {
    match &observed.resolution {
        Resolution::JukeboxMissing => {
            let message = format!("JukeBox {} is missing", instance.jukebox);
            let mut plan = Plan::blocked(Criterion::Jukebox, None, message.clone(), REQUEUE);
            plan.steps.push(event_warning("MissingJukebox", message));
            Err(plan)
        }
        // Nothing newer may be installed (withheld by the JukeBox, or
        // quarantined for the instance) and the installed revision has left
        // the catalog: the instance stays where it is (no Job, no
        // condition), waiting, saying why.
        Resolution::NoMatch { excluded_by, reason }
            if let Some(on) = held_back_by(excluded_by)
                && let Some(installed) = instance.installed_tag() =>
        {
            let installed = installed.to_string();
            let why = format!("staying at {installed}: {reason}");
            let outcome = Outcome::Waiting { to: installed, until: None, why, on };
            Err(Plan { steps: Vec::new(), outcome, requeue: REQUEUE })
        }
        // A quarantine is no missing package: it says what it is.
        Resolution::NoMatch { excluded_by, reason } if held_back_by(excluded_by).is_some() => {
            let message = format!("Package {}/{}: {reason}", instance.category, instance.package);
            Err(Plan::blocked(Criterion::Package, None, message, REQUEUE))
        }
        Resolution::NoMatch { reason, .. } => {
            let message = format!("Package {}/{} is missing: {reason}", instance.category, instance.package);
            let mut plan = Plan::blocked(Criterion::Package, None, message.clone(), REQUEUE);
            plan.steps.push(event_warning("MissingPackage", message));
            Err(plan)
        }
        Resolution::Unconfirmed { reason } => {
            let message = coded_message("E_UNCONFIRMED", reason);
            Err(Plan::blocked(Criterion::Package, Some("E_UNCONFIRMED"), message, RETRY_SHORT))
        }
        Resolution::Package { package, pull_secret } => Ok((package, pull_secret)),
    }
}

/// What a catalog's exclusion waits for, when it holds revisions back
/// rather than finding none: the JukeBox's withholding, or the instance's
/// own quarantines.
fn held_back_by(excluded_by: &str) -> Option<WaitFor> {
    use vynil_rules::selection::Exclusion;
    match Exclusion::parse(excluded_by)? {
        Exclusion::Withheld => Some(WaitFor::Withheld),
        Exclusion::Quarantined => Some(WaitFor::Quarantine),
        _ => None,
    }
}

/// The options, checked against the package's schema. Upstream passes
/// options through unchecked: an instance it installed keeps being served,
/// with a warning (`docs/lifecycle.md`, options); any other is blocked.
pub(super) fn checked_options(
    instance: &Instance,
    checks: &RevisionChecks,
) -> Result<(CheckedOptions, Option<Step>), Plan> {
    match &checks.options {
        Ok(checked) => Ok((checked.clone(), None)),
        Err(problem) if instance.upstream_installed() => {
            let warning = event_warning(
                "OptionTypeMismatch",
                format!(
                    "{problem}; installed by upstream's operator, which does not check option types: the value is passed through as upstream passes it"
                ),
            );
            Ok((CheckedOptions::default(), Some(warning)))
        }
        Err(problem) => Err(Plan::blocked(
            Criterion::Options,
            Some("E_OPTION_TYPE"),
            coded_message("E_OPTION_TYPE", &problem.to_string()),
            REQUEUE,
        )),
    }
}

/// The tag and digest to install: `initFrom.version` on a first install
/// when asked (blocked when the registry does not have it, the JukeBox
/// recalls it or its enforced signature policy refuses it), else the catalog's.
pub(super) fn init_version(observed: &Observed, package: &Package) -> Result<(String, Option<String>), Plan> {
    match &observed.init_version {
        InitVersion::NotFound(version) => {
            let message = coded_message(
                "E_INIT_VERSION_NOT_FOUND",
                &format!("Version {version} introuvable dans le registre OCI"),
            );
            Err(Plan::blocked(Criterion::InitFrom, Some("E_INIT_VERSION_NOT_FOUND"), message, RETRY_SHORT))
        }
        InitVersion::Recalled(recall) => {
            let message = coded_message(
                "E_RECALLED",
                &format!(
                    "initFrom.version: {recall}; name another version, or have an operator lift the recall"
                ),
            );
            Err(Plan::blocked(Criterion::InitFrom, Some("E_RECALLED"), message, REQUEUE))
        }
        InitVersion::Unverified { tag, verdict } => {
            let message = coded_message(
                "E_UNVERIFIED",
                &format!(
                    "initFrom.version {tag}: {}; the JukeBox enforces its signature policy: name a \
                     verified version, or have {tag} signed by a key the JukeBox trusts",
                    verdict.describe()
                ),
            );
            Err(Plan::blocked(Criterion::InitFrom, Some("E_UNVERIFIED"), message, REQUEUE))
        }
        InitVersion::Found { tag, digest } => Ok((tag.clone(), digest.clone())),
        InitVersion::NotAsked => Ok((package.tag.clone(), package.digest.clone())),
    }
}

/// Under an enforced signature policy, the catalog's revision `tag` is
/// verified: selection offers no other, but an instance keeps the revision it
/// runs, and a re-run or a rollback is an install Job too.
pub(super) fn verified(observed: &Observed, package: &Package, tag: &str) -> Result<(), Plan> {
    use vynil_rules::signature::{Verdict, VerifyMode};
    if observed.held_back.verify != Some(VerifyMode::Enforce) || package.tag != tag {
        return Ok(());
    }
    let verdict = package.signature.clone().unwrap_or(Verdict::Unsigned);
    if verdict.is_verified() {
        return Ok(());
    }
    let message = coded_message(
        "E_UNVERIFIED",
        &format!(
            "{tag}: {}; the JukeBox enforces its signature policy, so no install or upgrade Job runs for it",
            verdict.describe()
        ),
    );
    Err(Plan::blocked(Criterion::Signature, Some("E_UNVERIFIED"), message, REQUEUE))
}

/// The package's requirements hold in this cluster, or it waits for them.
pub(super) fn requirements_met(checks: &RevisionChecks) -> Result<(), Plan> {
    match &checks.unmet {
        Some(unmet) => {
            let mut plan =
                Plan::blocked(Criterion::Requirement, None, unmet.message.clone(), unmet.retry_after);
            plan.steps.push(event_warning("MissingRequirement", unmet.message.clone()));
            Err(plan)
        }
        None => Ok(()),
    }
}

/// `value_script`'s values, within what the delete Job can be given.
pub(super) fn controller_values(checks: &RevisionChecks) -> Result<String, Plan> {
    match &checks.controller_values {
        Ok(values) if values.len() > MAX_CONTROLLER_VALUES => {
            let message = coded_message(
                "E_VALUES_TOO_LARGE",
                &format!(
                    "value_script produced {} bytes of controller values, at most {MAX_CONTROLLER_VALUES} are recorded for the delete Job: make the package's value_script smaller",
                    values.len()
                ),
            );
            Err(Plan::blocked(Criterion::ValueScript, Some("E_VALUES_TOO_LARGE"), message, REQUEUE))
        }
        Ok(values) => Ok(values.clone()),
        Err(why) => {
            let message =
                coded_message("E_VALUE_SCRIPT", &format!("the package's value_script failed: {why}"));
            Err(Plan::blocked(Criterion::ValueScript, Some("E_VALUE_SCRIPT"), message, RETRY_SHORT))
        }
    }
}
