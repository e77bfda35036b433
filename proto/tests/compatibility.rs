//! The contracts evolve compatibly, in the manner of `buf breaking`: a rolling
//! update runs two releases side by side, so each released snapshot of the
//! descriptors (`proto/compat/<version>.binpb`) must still be served by
//! today's: no message, enum, service or RPC removed; no field or enum value
//! renumbered, retyped, renamed or removed without being reserved; no RPC
//! whose request, response or streaming changed.
//!
//! At a release, record its snapshot: `UPDATE_PROTO_SNAPSHOT=1 cargo test -p
//! vynil-proto --test compatibility` writes `proto/compat/<version>.binpb`.
//! A snapshot is a release's: it is added, never rewritten (the switch
//! refuses to replace one that differs, so it cannot heal a break by moving
//! the release's contract to today's), and every snapshot is checked.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;

use prost::Message;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

fn messages(set: &FileDescriptorSet) -> BTreeMap<String, DescriptorProto> {
    fn walk(prefix: &str, list: &[DescriptorProto], out: &mut BTreeMap<String, DescriptorProto>) {
        for message in list {
            let name = format!("{prefix}.{}", message.name());
            walk(&name, &message.nested_type, out);
            out.insert(name, message.clone());
        }
    }
    let mut out = BTreeMap::new();
    for file in &set.file {
        walk(file.package(), &file.message_type, &mut out);
    }
    out
}

fn enums(set: &FileDescriptorSet) -> BTreeMap<String, EnumDescriptorProto> {
    let mut out = BTreeMap::new();
    for (name, message) in messages(set) {
        for e in &message.enum_type {
            out.insert(format!("{name}.{}", e.name()), e.clone());
        }
    }
    for file in &set.file {
        for e in &file.enum_type {
            out.insert(format!("{}.{}", file.package(), e.name()), e.clone());
        }
    }
    out
}

/// What `new` breaks of `old`, in words.
fn breaking(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    let mut problems = Vec::new();
    let new_messages = messages(new);
    for (name, before) in messages(old) {
        let Some(after) = new_messages.get(&name) else {
            problems.push(format!("message {name} was removed"));
            continue;
        };
        for field in &before.field {
            let reserved =
                after.reserved_range.iter().any(|r| r.start() <= field.number() && field.number() < r.end())
                    || after.reserved_name.iter().any(|n| n == field.name());
            match after.field.iter().find(|f| f.number() == field.number()) {
                None if !reserved => problems.push(format!(
                    "{name}.{} ({}) was removed without being reserved",
                    field.name(),
                    field.number()
                )),
                None => {}
                Some(now) => {
                    if now.name() != field.name() {
                        problems.push(format!(
                            "{name} field {} was renamed {} → {}",
                            field.number(),
                            field.name(),
                            now.name()
                        ));
                    }
                    if now.r#type() != field.r#type()
                        || now.type_name() != field.type_name()
                        || now.label() != field.label()
                    {
                        problems.push(format!("{name}.{} changed type or label", field.name()));
                    }
                    if now.oneof_index.is_some() != field.oneof_index.is_some() {
                        problems.push(format!("{name}.{} moved in or out of a oneof", field.name()));
                    }
                }
            }
        }
    }
    let new_enums = enums(new);
    for (name, before) in enums(old) {
        let Some(after) = new_enums.get(&name) else {
            problems.push(format!("enum {name} was removed"));
            continue;
        };
        for value in &before.value {
            let reserved =
                after.reserved_range.iter().any(|r| r.start() <= value.number() && value.number() <= r.end())
                    || after.reserved_name.iter().any(|n| n == value.name());
            match after.value.iter().find(|v| v.number() == value.number()) {
                None if !reserved => problems.push(format!(
                    "{name}.{} ({}) was removed without being reserved",
                    value.name(),
                    value.number()
                )),
                Some(now) if now.name() != value.name() => problems.push(format!(
                    "{name} value {} was renamed {} → {}",
                    value.number(),
                    value.name(),
                    now.name()
                )),
                _ => {}
            }
        }
    }
    let services = |set: &FileDescriptorSet| -> BTreeMap<String, prost_types::ServiceDescriptorProto> {
        set.file
            .iter()
            .flat_map(|f| f.service.iter().map(move |s| (format!("{}.{}", f.package(), s.name()), s.clone())))
            .collect()
    };
    let new_services = services(new);
    for (name, before) in services(old) {
        let Some(after) = new_services.get(&name) else {
            problems.push(format!("service {name} was removed"));
            continue;
        };
        for method in &before.method {
            match after.method.iter().find(|m| m.name() == method.name()) {
                None => problems.push(format!("rpc {name}/{} was removed", method.name())),
                Some(now) => {
                    let shape = |m: &prost_types::MethodDescriptorProto| {
                        (
                            m.input_type().to_string(),
                            m.output_type().to_string(),
                            m.client_streaming(),
                            m.server_streaming(),
                        )
                    };
                    if shape(now) != shape(method) {
                        problems.push(format!(
                            "rpc {name}/{} changed its request, response or streaming",
                            method.name()
                        ));
                    }
                }
            }
        }
    }
    problems
}

fn current() -> FileDescriptorSet {
    FileDescriptorSet::decode(vynil_proto::FILE_DESCRIPTOR_SET).unwrap()
}

/// Records `descriptors` as release `version`'s snapshot in `dir`; a
/// snapshot already recorded stays as it is, and one that differs is refused.
fn record_release(dir: &std::path::Path, version: &str, descriptors: &[u8]) -> Result<(), String> {
    let path = dir.join(format!("{version}.binpb"));
    match std::fs::read(&path) {
        Ok(recorded) if recorded == descriptors => Ok(()),
        Ok(_) => Err(format!(
            "{} is release {version}'s contract and is never rewritten: today's protos differ from it, \
             so bump the workspace version before recording a new release",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&path, descriptors).map_err(|e| format!("cannot write {}: {e}", path.display()))
        }
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

#[test]
fn a_released_snapshot_is_added_never_rewritten() {
    let dir = std::env::temp_dir().join(format!("vynil-proto-compat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(record_release(&dir, "1.0.0", b"release one"), Ok(()));
    assert_eq!(record_release(&dir, "1.0.0", b"release one"), Ok(()), "recording the same again");
    let refused = record_release(&dir, "1.0.0", b"changed since").unwrap_err();
    assert!(refused.contains("never rewritten"), "{refused}");
    assert_eq!(
        std::fs::read(dir.join("1.0.0.binpb")).unwrap(),
        b"release one",
        "the release's contract stays"
    );
    assert_eq!(record_release(&dir, "1.1.0", b"changed since"), Ok(()), "a new release is added");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_released_snapshot_is_still_served_compatibly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("compat");
    if std::env::var_os("UPDATE_PROTO_SNAPSHOT").is_some() {
        record_release(&dir, env!("CARGO_PKG_VERSION"), vynil_proto::FILE_DESCRIPTOR_SET)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "binpb") {
            let old = FileDescriptorSet::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
            let problems = breaking(&old, &current());
            assert!(
                problems.is_empty(),
                "{} is broken by today's protos:\n{}",
                path.display(),
                problems.join("\n")
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no snapshot in proto/compat: record one (UPDATE_PROTO_SNAPSHOT=1)");
}

#[test]
fn the_checker_sees_a_retyped_a_removed_and_a_renumbered_field_and_a_removed_rpc() {
    let old = current();
    let mut new = old.clone();
    let file = new.file.iter_mut().find(|f| f.package() == "vynil.purger.v1").unwrap();
    let plan = file.message_type.iter_mut().find(|m| m.name() == "PurgePlan").unwrap();
    plan.field
        .iter_mut()
        .find(|f| f.name() == "usage_unknown")
        .unwrap()
        .set_type(prost_types::field_descriptor_proto::Type::String);
    plan.field.retain(|f| f.name() != "fingerprint");
    plan.field.iter_mut().find(|f| f.name() == "target").unwrap().number = Some(99);
    file.service[0].method.retain(|m| m.name() != "GetReport");
    let problems = breaking(&old, &new).join("\n");
    assert!(problems.contains("PurgePlan.usage_unknown changed type"), "{problems}");
    assert!(problems.contains("PurgePlan.fingerprint (3) was removed without being reserved"), "{problems}");
    assert!(problems.contains("PurgePlan.target (2) was removed"), "{problems}");
    assert!(problems.contains("rpc vynil.purger.v1.Purger/GetReport was removed"), "{problems}");
    assert!(breaking(&old, &old).is_empty());
}
