//! OCI image layouts through the same client as registries: the example
//! package set pushed to a real registry and written as a layout reads the
//! same (tags, digests, Vynil metadata, signatures); a delete rewrites
//! `index.json` and leaves exactly what is still referenced; a crash between
//! the rewrite and the blob removal leaves a valid layout the next run cleans.

#![allow(clippy::unwrap_used, clippy::panic)]

mod common;

use std::{collections::BTreeSet, path::Path};

use common::client;
use vynil_registry::{CredentialStore, DeletionOutcome, RegistryError, RepositoryRef};
use vynil_testkit::{
    EXAMPLE_REPOSITORIES, LayoutWriter, RegistryServer, publish_examples, reachable_blobs, stored_blobs,
    write_examples,
};

fn layout_repo(root: &Path, repository: &str) -> RepositoryRef {
    RepositoryRef::new(&format!("oci-layout:{}", root.display()), repository).unwrap()
}

fn blobs(dir: &Path) -> BTreeSet<String> {
    stored_blobs(dir)
}

fn reachable(dir: &Path) -> BTreeSet<String> {
    reachable_blobs(dir).unwrap()
}

/// Every blob of `dir` as if written two hours ago, past the collection's
/// one-hour grace.
fn age(dir: &Path) {
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
    for blob in std::fs::read_dir(dir.join("blobs/sha256")).unwrap() {
        let file = std::fs::File::options().write(true).open(blob.unwrap().path());
        // A FIFO cannot be opened for writing without a reader; its age does not matter.
        if let Ok(file) = file {
            file.set_modified(past).unwrap();
        }
    }
}

/// Writes `bytes` as a blob of `dir`; its digest.
fn put_blob(dir: &Path, bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hex = hex::encode(sha2::Sha256::digest(bytes));
    std::fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
    format!("sha256:{hex}")
}

#[tokio::test]
async fn a_layout_reads_as_the_registry_holding_the_same_packages() {
    let registry = RegistryServer::start().await.unwrap();
    publish_examples(&registry.publisher()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_examples(&LayoutWriter::new(dir.path())).unwrap();
    let client = client(&registry.host(), CredentialStore::default());

    let source = vynil_registry::sources::Source::Layout { path: dir.path().display().to_string() };
    let found: Vec<String> =
        client.enumerate(&source).await.unwrap().into_iter().map(|r| r.repository).collect();
    let mut expected: Vec<String> = EXAMPLE_REPOSITORIES.iter().map(|r| r.to_string()).collect();
    expected.sort();
    assert_eq!(found, expected);

    for repository in EXAMPLE_REPOSITORIES {
        let (remote, local) =
            (common::repo(&registry.host(), repository), layout_repo(dir.path(), repository));
        let mut remote_tags = client.list_tags(&remote).await.unwrap();
        let mut local_tags = client.list_tags(&local).await.unwrap();
        remote_tags.sort();
        local_tags.sort();
        assert_eq!(remote_tags, local_tags, "{repository}");
        for tag in &remote_tags {
            let a = client.tag_metadata(&remote, tag).await.unwrap().unwrap();
            let b = client.tag_metadata(&local, tag).await.unwrap().unwrap();
            assert_eq!((&a.digest, &a.metadata), (&b.digest, &b.metadata), "{repository}:{tag}");
            let artifacts_a = client.artifacts(&remote, &a.digest, &remote_tags).await.unwrap();
            let artifacts_b = client.artifacts(&local, &b.digest, &local_tags).await.unwrap();
            assert_eq!(artifacts_a, artifacts_b, "{repository}:{tag}");
        }
    }
    // The signed revision really has its signature, in both.
    let local = layout_repo(dir.path(), "think/ollama");
    let signed = client.tag_metadata(&local, "0.1.10").await.unwrap().unwrap();
    let tags = client.list_tags(&local).await.unwrap();
    assert_eq!(client.artifacts(&local, &signed.digest, &tags).await.unwrap()[0].kind, "signature");
}

#[tokio::test]
async fn a_delete_leaves_exactly_what_is_still_referenced_and_a_crash_after_the_rewrite_is_cleaned_next() {
    let dir = tempfile::tempdir().unwrap();
    write_examples(&LayoutWriter::new(dir.path())).unwrap();
    let client = client("unused.example", CredentialStore::default());
    let repo = layout_repo(dir.path(), "apps/web");
    let repo_dir = dir.path().join("apps/web");
    let digest = client.head_digest(&repo, "1.0.0").await.unwrap().unwrap();
    age(&repo_dir);
    let before = blobs(&repo_dir);

    let outcome = client.delete_digest(&repo, &digest, &["1.0.0".to_string()]).await;
    assert_eq!(outcome, DeletionOutcome::Deleted { tags: vec!["1.0.0".into()] });
    assert!(!client.list_tags(&repo).await.unwrap().contains(&"1.0.0".to_string()));
    assert_eq!(blobs(&repo_dir), reachable(&repo_dir), "nothing unreferenced, nothing referenced missing");
    let gone: Vec<String> = before.difference(&blobs(&repo_dir)).cloned().collect();
    assert_eq!(gone, std::slice::from_ref(&digest), "only 1.0.0's manifest: config and layer are shared");
    assert_eq!(client.delete_digest(&repo, &digest, &[]).await, DeletionOutcome::AlreadyGone);

    // A crash right after the index rewrite: 1.5.0 is out of index.json, its blob is not removed.
    let index_path = repo_dir.join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let crashed = client.head_digest(&repo, "1.5.0").await.unwrap().unwrap();
    index["manifests"].as_array_mut().unwrap().retain(|m| m["digest"] != crashed.as_str());
    std::fs::write(&index_path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    // Valid: every tag still reads, every referenced blob is there.
    for tag in client.list_tags(&repo).await.unwrap() {
        assert!(client.tag_metadata(&repo, &tag).await.unwrap().is_some(), "{tag}");
    }
    assert!(blobs(&repo_dir).contains(&crashed), "the leftover is there");
    assert_eq!(client.collect_garbage(&repo).await.unwrap(), 1);
    assert_eq!(blobs(&repo_dir), reachable(&repo_dir));
}

/// Security review item 5: the collection removes only what is surely
/// garbage and reads only manifests. A manifest that is there but unreadable
/// may reference anything, so it keeps its config and layer (and every
/// other blob); a layer is never opened (here a FIFO, which would block a
/// reader forever, as a multi-GiB layer would fill a small purger's
/// memory); a blob written moments ago by a copy in progress stays.
#[tokio::test]
async fn the_layout_collection_keeps_what_it_cannot_read_reads_no_layer_and_spares_a_copy_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    write_examples(&LayoutWriter::new(dir.path())).unwrap();
    let client = client("unused.example", CredentialStore::default());
    let repo = layout_repo(dir.path(), "apps/web");
    let repo_dir = dir.path().join("apps/web");

    // An extra tagged image with its own config and layer.
    let config = put_blob(&repo_dir, br#"{"architecture":"amd64","os":"linux"}"#);
    let layer = put_blob(&repo_dir, b"a layer nobody else has");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 38},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": 23}],
    });
    let extra = put_blob(&repo_dir, manifest.to_string().as_bytes());
    let index_path = repo_dir.join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["manifests"].as_array_mut().unwrap().push(serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": extra, "size": 300,
        "annotations": {"org.opencontainers.image.ref.name": "extra"},
    }));
    std::fs::write(&index_path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    // An old orphan, surely garbage.
    let orphan = put_blob(&repo_dir, b"left by a crash long ago");
    age(&repo_dir);

    // The extra manifest becomes unreadable (its bytes no longer match its digest).
    let extra_path = repo_dir.join("blobs/sha256").join(extra.trim_start_matches("sha256:"));
    std::fs::write(&extra_path, b"{ truncated").unwrap();
    let before = blobs(&repo_dir);
    assert_eq!(client.collect_garbage(&repo).await.unwrap(), 0, "nothing while a manifest is unreadable");
    assert_eq!(blobs(&repo_dir), before);
    assert!(blobs(&repo_dir).is_superset(&[config.clone(), layer.clone()].into()));

    // Readable again: the orphan goes, the extra image's blobs stay.
    std::fs::write(&extra_path, manifest.to_string().as_bytes()).unwrap();
    age(&repo_dir);
    assert_eq!(client.collect_garbage(&repo).await.unwrap(), 1);
    assert!(!blobs(&repo_dir).contains(&orphan));
    assert!(blobs(&repo_dir).is_superset(&[config.clone(), layer.clone(), extra.clone()].into()));

    // The layer replaced by a FIFO: a collection that opened layers would block on it.
    let layer_path = repo_dir.join("blobs/sha256").join(layer.trim_start_matches("sha256:"));
    std::fs::remove_file(&layer_path).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&layer_path).status().unwrap();
    assert!(made.success(), "mkfifo (coreutils)");
    let collected =
        tokio::time::timeout(std::time::Duration::from_secs(20), client.collect_garbage(&repo)).await;
    if collected.is_err() {
        // Release the blocked reader (EOF) so the test can end, then fail.
        let _ = std::fs::write(&layer_path, b"");
        panic!("the collection opened a layer");
    }
    assert_eq!(collected.unwrap().unwrap(), 0);
    std::fs::remove_file(&layer_path).unwrap();

    // A blob a copy in progress just wrote (its index not yet rewritten) stays, until it is old.
    let fresh = put_blob(&repo_dir, b"a blob skopeo is copying");
    assert_eq!(client.collect_garbage(&repo).await.unwrap(), 0);
    assert!(blobs(&repo_dir).contains(&fresh), "within the grace");
    age(&repo_dir);
    assert_eq!(client.collect_garbage(&repo).await.unwrap(), 1);
    assert!(!blobs(&repo_dir).contains(&fresh));
}

#[tokio::test]
async fn one_shared_layout_names_its_repositories_in_ref_names_and_a_broken_one_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    write_examples(&LayoutWriter::new(dir.path())).unwrap();
    // One layout for both repositories: entries named `<repository>:<tag>`.
    let shared = tempfile::tempdir().unwrap();
    let mut manifests = Vec::new();
    std::fs::create_dir_all(shared.path().join("blobs/sha256")).unwrap();
    for repository in EXAMPLE_REPOSITORIES {
        let own = dir.path().join(repository);
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(own.join("index.json")).unwrap()).unwrap();
        for mut entry in index["manifests"].as_array().unwrap().clone() {
            let tag = entry["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap().to_string();
            entry["annotations"]["org.opencontainers.image.ref.name"] = format!("{repository}:{tag}").into();
            manifests.push(entry);
        }
        for blob in std::fs::read_dir(own.join("blobs/sha256")).unwrap() {
            let blob = blob.unwrap();
            std::fs::copy(blob.path(), shared.path().join("blobs/sha256").join(blob.file_name())).unwrap();
        }
    }
    let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests});
    std::fs::write(shared.path().join("index.json"), index.to_string()).unwrap();
    let client = client("unused.example", CredentialStore::default());
    let source = vynil_registry::sources::Source::Layout { path: shared.path().display().to_string() };
    let found: Vec<String> =
        client.enumerate(&source).await.unwrap().into_iter().map(|r| r.repository).collect();
    assert_eq!(found, ["apps/web", "think/ollama"]);
    let mut tags = client.list_tags(&layout_repo(shared.path(), "think/ollama")).await.unwrap();
    tags.retain(|t| !t.ends_with(".sig"));
    assert_eq!(tags, ["0.1.8", "0.1.9", "0.1.10"]);

    std::fs::write(shared.path().join("index.json"), "{not json").unwrap();
    let error = client.list_tags(&layout_repo(shared.path(), "think/ollama")).await.unwrap_err();
    assert!(matches!(error, RegistryError::Layout { .. }), "{error:?}");
    assert!(error.to_string().contains("index.json"), "{error}");
    let missing = client.list_tags(&layout_repo(&shared.path().join("nowhere"), "x")).await.unwrap_err();
    assert!(matches!(missing, RegistryError::NotFound { .. }), "{missing:?}");
}

/// Issue "Credentials that stay where they belong" item 10: two processes
/// (two purger replicas sharing a layout) delete from one `index.json` at
/// once. Each rewrites the index from what it read: unserialized, one
/// process's rewrite drops the other's deletes and the tags come back (and
/// the collection removes blobs they still reference). An advisory lock
/// beside `index.json` serializes them: every delete holds.
#[tokio::test]
async fn two_processes_deleting_from_one_layout_lose_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let writer = LayoutWriter::new(dir.path());
    let digests: Vec<String> =
        (0..40).map(|i| writer.publish_plain("apps/many", &format!("1.0.{i}")).unwrap()).collect();
    age(&dir.path().join("apps/many"));
    let exe = std::env::current_exe().unwrap();
    let child = |part: &[String]| {
        std::process::Command::new(&exe)
            .args(["--exact", "a_deleting_process", "--ignored", "--nocapture"])
            .env("VYNIL_LAYOUT_CHILD", format!("{}|{}", dir.path().display(), part.join(",")))
            .output()
    };
    let (first, second) = std::thread::scope(|scope| {
        let first = scope.spawn(|| child(&digests[..20]));
        let second = scope.spawn(|| child(&digests[20..]));
        (first.join().unwrap().unwrap(), second.join().unwrap().unwrap())
    });
    for out in [&first, &second] {
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{said}");
    }
    let client = client("unused.example", CredentialStore::default());
    let left = client.list_tags(&layout_repo(dir.path(), "apps/many")).await.unwrap();
    assert!(left.is_empty(), "deletes lost to the other process's rewrite: {left:?}");
    let repo_dir = dir.path().join("apps/many");
    assert!(reachable(&repo_dir).is_subset(&blobs(&repo_dir)), "a referenced blob was removed");
}

/// One side of `two_processes_deleting_from_one_layout_lose_no_update`, run
/// as its own process by it.
#[tokio::test]
#[ignore = "a child process of two_processes_deleting_from_one_layout_lose_no_update"]
async fn a_deleting_process() {
    let given = std::env::var("VYNIL_LAYOUT_CHILD").expect("run by its parent test");
    let (root, digests) = given.split_once('|').unwrap();
    let client = client("unused.example", CredentialStore::default());
    let repo = layout_repo(Path::new(root), "apps/many");
    for digest in digests.split(',') {
        let outcome = client.delete_digest(&repo, digest, &[]).await;
        assert!(matches!(outcome, DeletionOutcome::Deleted { .. }), "{digest}: {outcome:?}");
    }
}
