//! The one conversion between the rules' [`Package`] and the catalog's wire
//! `Package`: the catalog answers with it, lifecycle reads it back.

use crate::catalog::v1::{self as pb, PackageType as ProtoType};
use tonic::Status;
use vynil_rules::{
    Package, PackageContent, PackageMeta, PackageType, Requirement,
    package::Recommandation,
    signature::{Verdict, VerifyMode},
};

/// A wire package type; unspecified or unknown is `INVALID_ARGUMENT`.
pub fn package_type(value: i32) -> Result<PackageType, Status> {
    match ProtoType::try_from(value) {
        Ok(ProtoType::Tenant) => Ok(PackageType::Tenant),
        Ok(ProtoType::Service) => Ok(PackageType::Service),
        Ok(ProtoType::System) => Ok(PackageType::System),
        _ => Err(Status::invalid_argument("type must be tenant, service or system")),
    }
}

pub fn proto_type(t: PackageType) -> i32 {
    (match t {
        PackageType::Tenant => ProtoType::Tenant,
        PackageType::Service => ProtoType::Service,
        PackageType::System => ProtoType::System,
    }) as i32
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

pub fn package_to_proto(p: &Package) -> pb::Package {
    let meta = &p.content.metadata;
    pb::Package {
        registry: p.registry.clone(),
        image: p.image.clone(),
        tag: p.tag.clone(),
        metadata: Some(pb::PackageMetadata {
            name: meta.name.clone(),
            category: meta.category.clone(),
            description: meta.description.clone(),
            app_version: meta.app_version.clone().unwrap_or_default(),
            r#type: proto_type(meta.package_type),
            features: meta.features.clone(),
            backup_affinity: meta.backup_affinity.clone().unwrap_or_default(),
        }),
        requirements_json: json(&p.content.requirements),
        recommandations_json: p.content.recommandations.as_ref().map(json).unwrap_or_default(),
        options_json: p.content.options.as_ref().map(json).unwrap_or_default(),
        value_script: p.content.value_script_source().ok().flatten().unwrap_or_default(),
        digest: p.digest.clone().unwrap_or_default(),
        roles: Vec::new(),
        first_seen: p.first_seen.clone().unwrap_or_default(),
        signature: p.signature.as_ref().map(signature_to_proto),
    }
}

/// A signature verdict on the wire.
pub fn signature_to_proto(verdict: &Verdict) -> pb::Signature {
    use pb::SignatureVerdict as V;
    let mut out = pb::Signature { description: verdict.describe(), ..pb::Signature::default() };
    let kind = match verdict {
        Verdict::Verified { key, reference } => {
            (out.key, out.reference) = (key.clone(), reference.clone());
            V::Verified
        }
        Verdict::Unsigned => V::Unsigned,
        Verdict::UntrustedKey => V::UntrustedKey,
        Verdict::DigestMismatch { signed } => {
            out.signed_digest = signed.clone();
            V::DigestMismatch
        }
        Verdict::Malformed { problem } => {
            out.problem = problem.clone();
            V::Malformed
        }
        Verdict::ReferenceMismatch { reference } => {
            out.reference = reference.clone();
            V::ReferenceMismatch
        }
        Verdict::Unattested { predicate_type, problem } => {
            (out.predicate_type, out.problem) = (predicate_type.clone(), problem.clone());
            V::Unattested
        }
    };
    out.verdict = kind as i32;
    out
}

/// A signature verdict from the wire (`None`: an unknown verdict, which no
/// policy counts as verified).
pub fn signature_from_proto(s: &pb::Signature) -> Option<Verdict> {
    use pb::SignatureVerdict as V;
    Some(match V::try_from(s.verdict).ok()? {
        V::Verified => Verdict::Verified { key: s.key.clone(), reference: s.reference.clone() },
        V::Unsigned => Verdict::Unsigned,
        V::UntrustedKey => Verdict::UntrustedKey,
        V::DigestMismatch => Verdict::DigestMismatch { signed: s.signed_digest.clone() },
        V::Malformed => Verdict::Malformed { problem: s.problem.clone() },
        V::ReferenceMismatch => Verdict::ReferenceMismatch { reference: s.reference.clone() },
        V::Unattested => {
            Verdict::Unattested { predicate_type: s.predicate_type.clone(), problem: s.problem.clone() }
        }
        V::Unspecified => return None,
    })
}

/// A JukeBox's signature policy mode on the wire.
pub fn verify_mode_to_proto(mode: Option<VerifyMode>) -> pb::VerifyMode {
    match mode {
        None => pb::VerifyMode::None,
        Some(VerifyMode::Enforce) => pb::VerifyMode::Enforce,
        Some(VerifyMode::Warn) => pb::VerifyMode::Warn,
    }
}

/// ... and from it (an unknown value is enforced: the safe reading).
pub fn verify_mode_from_proto(mode: i32) -> Option<VerifyMode> {
    match pb::VerifyMode::try_from(mode) {
        Ok(pb::VerifyMode::None) => None,
        Ok(pb::VerifyMode::Warn) => Some(VerifyMode::Warn),
        Ok(pb::VerifyMode::Enforce) | Err(_) => Some(VerifyMode::Enforce),
    }
}

/// The rules' package from the wire; a malformed field is `DATA_LOSS`-free
/// `INTERNAL` naming it (the catalog wrote it from a parsed package).
pub fn package_from_proto(p: &pb::Package) -> Result<Package, Status> {
    let bad = |field: &str, e: serde_json::Error| {
        Status::internal(format!("the catalog's package {}:{} has a malformed {field}: {e}", p.image, p.tag))
    };
    let meta =
        p.metadata.as_ref().ok_or_else(|| Status::internal("the catalog's package has no metadata"))?;
    let optional = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
    let requirements: Vec<Requirement> = if p.requirements_json.is_empty() {
        Vec::new()
    } else {
        serde_json::from_str(&p.requirements_json).map_err(|e| bad("requirements", e))?
    };
    let recommandations: Option<Vec<Recommandation>> = match p.recommandations_json.as_str() {
        "" => None,
        text => Some(serde_json::from_str(text).map_err(|e| bad("recommandations", e))?),
    };
    let options = match p.options_json.as_str() {
        "" => None,
        text => Some(serde_json::from_str(text).map_err(|e| bad("options", e))?),
    };
    // Stored as upstream does: the JSON string literal of the source.
    let value_script = optional(&p.value_script).map(|source| json(&source));
    let content = PackageContent {
        metadata: PackageMeta {
            name: meta.name.clone(),
            category: meta.category.clone(),
            description: meta.description.clone(),
            app_version: optional(&meta.app_version),
            package_type: package_type(meta.r#type)?,
            features: meta.features.clone(),
            backup_affinity: optional(&meta.backup_affinity),
        },
        requirements,
        recommandations,
        options,
        value_script,
    };
    let mut package = Package::new(&p.registry, &p.image, &p.tag, content).with_digest(&p.digest);
    package.first_seen = optional(&p.first_seen);
    package.signature = p.signature.as_ref().map(|s| signature_from_proto(s).unwrap_or(Verdict::Unsigned));
    Ok(package)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vynil_rules::package::{ClusterVersion, Prefly};

    #[test]
    fn a_package_survives_the_round_trip_through_the_wire() {
        let mut content = PackageContent::minimal("think", "ollama", PackageType::Service)
            .requiring(Requirement::ClusterVersion(ClusterVersion { major: 1, minor: 28 }))
            .requiring(Requirement::Prefly(Prefly { script: "true".into(), name: "p".into() }));
        content.metadata.app_version = Some("0.24.0".into());
        content.recommandations = Some(vec![Recommandation::TenantService("sso".into())]);
        content.options = serde_json::from_str(r#"{"gpu":{"type":"boolean","default":false}}"#).ok();
        content.value_script = Some(json(&"#{ gpu: true }"));
        let package =
            Package::new("registry.example", "think/ollama", "1.0.0", content).with_digest("sha256:ab");
        assert_eq!(package_from_proto(&package_to_proto(&package)).unwrap(), package);
    }
}
