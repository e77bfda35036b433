//! Shared set-up: a client for a loopback registry with fast retries.

#![allow(dead_code, clippy::unwrap_used)]

use std::{sync::Arc, time::Duration};

use vynil_registry::{
    CredentialStore, InMemoryMetadataCache, RegistryClient, RepositoryRef, TransportConfig,
};

pub fn config(host: &str) -> TransportConfig {
    TransportConfig {
        insecure_registries: vec![host.to_string()],
        timeout: Duration::from_millis(1500),
        max_attempts: 3,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
        per_registry_concurrency: 4,
        max_manifest_bytes: 4 * 1024 * 1024,
        layout_gc_grace: Duration::from_secs(3600),
        credential_hosts: Vec::new(),
    }
}

pub fn client(host: &str, credentials: CredentialStore) -> RegistryClient {
    RegistryClient::new(config(host), credentials, Arc::new(InMemoryMetadataCache::default())).unwrap()
}

pub fn repo(host: &str, repository: &str) -> RepositoryRef {
    RepositoryRef::new(host, repository).unwrap()
}
