//! `install::Asks`: a reconcile gathers only what a revision asks of the
//! cluster, so what `unmet_requirement` and `recommended` consult must be
//! asked. Every requirement and recommendation kind, one at a time, against
//! facts that record what is consulted.

use std::cell::RefCell;

use semver::Version;
use vynil_rules::{
    PackageContent, PackageType,
    install::{Asks, ClusterFacts, recommended, unmet_requirement},
    package::{ClusterVersion, PackageRef, Prefly, Recommandation, Requirement},
};

#[derive(Default)]
struct Recording(RefCell<Asks>);

impl Recording {
    fn saw(&self, f: impl FnOnce(&mut Asks)) {
        f(&mut self.0.borrow_mut());
    }
}

impl ClusterFacts for Recording {
    fn cluster_version(&self) -> ClusterVersion {
        self.saw(|a| a.version = true);
        ClusterVersion { major: 1, minor: 30 }
    }
    fn has_crd(&self, _: &str) -> bool {
        self.saw(|a| a.crds = true);
        true
    }
    fn has_system_package(&self, _: &PackageRef) -> bool {
        self.saw(|a| a.instances = true);
        true
    }
    fn has_tenant_package(&self, _: &PackageRef) -> bool {
        self.saw(|a| a.instances = true);
        true
    }
    fn has_system_service(&self, _: &str) -> bool {
        self.saw(|a| a.instances = true);
        true
    }
    fn has_tenant_service(&self, _: &str) -> bool {
        self.saw(|a| a.instances = true);
        true
    }
    fn prefly(&self, _: &Prefly) -> Result<bool, String> {
        self.saw(|a| a.instances = true);
        Ok(true)
    }
}

fn consulted(content: &PackageContent, kind: PackageType) -> Asks {
    let facts = Recording::default();
    unmet_requirement(content, kind, &Version::new(0, 8, 0), &facts);
    recommended(content, kind, &facts);
    facts.0.into_inner()
}

fn covers(asked: Asks, consulted: Asks) -> bool {
    (asked.version || !consulted.version)
        && (asked.crds || !consulted.crds)
        && (asked.instances || !consulted.instances)
}

#[test]
fn what_the_decision_consults_is_asked_for_every_kind_of_requirement_and_recommendation() {
    let package = PackageRef { category: "core".into(), name: "db".into() };
    let requirements = [
        Requirement::CustomResourceDefinition("certificates.cert-manager.io".into()),
        Requirement::SystemService("dns".into()),
        Requirement::TenantService("db".into()),
        Requirement::SystemPackage(package.clone()),
        Requirement::TenantPackage(package),
        Requirement::Prefly(Prefly { script: "true".into(), name: "always".into() }),
        Requirement::ClusterVersion(ClusterVersion { major: 1, minor: 28 }),
        Requirement::StorageCapability("RWX".into()),
        Requirement::MinimumPreviousVersion("1.0.0".into()),
        Requirement::VynilVersion("0.7.0".into()),
        Requirement::Cpu(1.0),
        Requirement::Memory(512),
        Requirement::Disk(1024),
        Requirement::Other { kind: "gpu".into(), value: serde_json::json!(1) },
    ];
    let recommandations = [
        Recommandation::CustomResourceDefinition("servicemonitors.monitoring.coreos.com".into()),
        Recommandation::SystemService("prometheus".into()),
        Recommandation::TenantService("grafana".into()),
    ];
    let mut contents: Vec<PackageContent> = requirements
        .into_iter()
        .map(|r| PackageContent {
            requirements: vec![r],
            ..PackageContent::minimal("apps", "web", PackageType::Tenant)
        })
        .collect();
    contents.extend(recommandations.into_iter().map(|r| PackageContent {
        recommandations: Some(vec![r]),
        ..PackageContent::minimal("apps", "web", PackageType::Tenant)
    }));
    let mut asked_something = 0;
    for content in &contents {
        for kind in [PackageType::Tenant, PackageType::Service, PackageType::System] {
            let (asked, seen) = (Asks::of(content), consulted(content, kind));
            assert!(covers(asked, seen), "{content:?} as {kind:?}: asks {asked:?}, consulted {seen:?}");
        }
        asked_something += usize::from(Asks::of(content) != Asks::default());
    }
    // Not vacuous: the kinds that consult the cluster do ask.
    assert_eq!(asked_something, 10, "CRD, 4 instance kinds, prefly, cluster version, 3 recommendations");
}

#[test]
fn a_revision_without_requirements_or_recommendations_asks_nothing() {
    let content = PackageContent::minimal("apps", "web", PackageType::Tenant);
    assert_eq!(Asks::of(&content), Asks::default());
    let versions_only = PackageContent {
        requirements: vec![
            Requirement::VynilVersion("0.7.0".into()),
            Requirement::MinimumPreviousVersion("1.0.0".into()),
        ],
        ..content
    };
    assert_eq!(Asks::of(&versions_only), Asks::default());
}
