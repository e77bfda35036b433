//! A fake Kubernetes API server and a fake agent, for whole-loop tests of the
//! real kube clients and controllers on machines where no API server can run.
//!
//! **It is not a cluster.** It stores JSON objects and answers the subset of
//! the API our services use, with the semantics they rely on:
//!
//! | emulated | how |
//! |---|---|
//! | discovery | `/version`, `/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>` (legacy discovery, not the aggregated v2 form); `/openapi/v2` (a document without definitions, protobuf) and `/openapi/v3` (each resource's PATCH with its `fieldValidation` parameter): what `kubectl` reads to leave validation to the server, so `kubectl apply`, `patch`, `annotate` and `get` work against the fake |
//! | resources | core (namespaces, configmaps, secrets, services, serviceaccounts, pods, PVCs, events), `batch` jobs/cronjobs, `apps` deployments/statefulsets, `coordination.k8s.io` leases, `events.k8s.io` events, RBAC, ingresses, network policies, CRDs; more with [`FakeApiServer::register`]; a created CRD serves its resource, a deleted one takes its objects along |
//! | verbs | get, list, watch, create, update (PUT), patch, delete, deletecollection |
//! | admission | every write, as the API server's (see `admission`): names per kind, label keys and values (63), annotations (256 KiB), finalizer names, owner references, `generateName` cut to 58; no new finalizer on an object being deleted; 413 above 3 MiB of body, "etcdserver: request is too large" (500) above 1.5 MiB stored; custom resources **pruned, defaulted and validated against their CRD's structural schema** (`jsonschema`), `/status` alike, unchanged invalid values let through on update (ratcheting); a PUT of a custom resource without `resourceVersion` is `422`; Jobs: `restartPolicy`, generated selector and `controller-uid`/`job-name` labels, immutable template, selector and completions; ConfigMap/Secret keys and 1 MiB, Secret data base64 (`stringData` merged); Lease durations; creates need an existing namespace that is not terminating (`404`, `403`). `422 Invalid` carries `details.causes[].field`; [`FakeApiServer::create_under_an_older_schema`] stores what a cluster can hold from an earlier schema |
//! | versions | one cluster-wide `resourceVersion`, bumped on each write; a write that changes nothing bumps nothing; a stale `metadata.resourceVersion` in a PUT or a patch gives `409 Conflict` |
//! | generation | starts at 1, bumped when anything but `metadata` and `status` changes, and when deletion starts |
//! | status subresource | writes to the object ignore `status`; writes to `/status` change only `status`; create drops `status` |
//! | patches | JSON merge patch; JSON patch (RFC 6902, `test` included: a failed test is `422`); strategic merge **as a merge patch** (lists replaced, not merged by key); server-side apply **as a merge patch** that creates a missing object (no field ownership, no conflicts) |
//! | deletion | `preconditions.uid`/`resourceVersion` of another object give `409 Conflict` ("Precondition failed"); an object with finalizers gets `deletionTimestamp` and stays until an update removes the last finalizer; without finalizers it goes at once. **Garbage collection is asynchronous**, after the request was answered: owner references are classified as Kubernetes' collector does: a dependent with an owner left that is not deleting in the foreground stays and loses its references to the others, one without goes; a namespaced owner counts only in its dependent's namespace (from another it is absent; named by a cluster-scoped dependent it cannot be resolved, and that dependent is never collected); `Foreground` holds the owner with `foregroundDeletion` until the dependents whose reference sets `blockOwnerDeletion` are gone, `Orphan` (`orphan` finalizer) frees them of their reference; a deleted namespace is `Terminating` (creates refused) until its content is gone. `default`, `kube-system`, `kube-public`, `kube-node-lease` exist from the start ([`FakeApiServer::create_namespaces`] for more) |
//! | selectors | label selectors (`=`, `==`, `!=`, exists, `!key`, `in`, `notin`); field selectors `=`/`!=` on **any** dotted path |
//! | watches | `watch=true` from a `resourceVersion` replays the retained history, then live events; without one (or `0`) every object as `ADDED` first; `sendInitialEvents` ends its replay with the `k8s.io/initial-events-end` bookmark; bookmarks every [`FakeApiOptions::bookmark_interval`] when allowed; `timeoutSeconds` honoured; a compacted version (see [`FakeApiServer::compact`]) gets an `ERROR` event with `410 Expired`; with a selector, an object that starts matching is sent as `ADDED`, one that stops as `DELETED`; live events are delivered from a queue after the write answered, [`FakeApiOptions::watch_lag`] late if set |
//! | lists | `limit` and `continue` (items in namespace/name order, `remainingItemCount`) |
//! | reviews | TokenReview and SubjectAccessReview answered from the test's table ([`FakeApiServer::add_token`], [`FakeApiServer::allow`]) |
//! | request log | every request with its RBAC verb, resource, namespace, name, user agent and bearer token ([`FakeApiServer::requests`]) |
//! | faults | per verb and resource: a status (`409`, `500`…), a delay or a concurrent write, for the next N requests ([`FakeApiServer::inject`]); every open watch ended at once ([`FakeApiServer::close_watches`]) |
//!
//! RBAC: with [`FakeApiOptions::rbac`], every request is authenticated by
//! its bearer token ([`ADMIN_TOKEN`] for [`FakeApiServer::client`],
//! [`FakeApiServer::service_account_token`] for a ServiceAccount) and
//! authorised by the Roles, ClusterRoles and bindings stored, as the RBAC
//! authorizer does (see `rbac`; `cluster-admin` and `system:discovery`
//! preloaded): `401` without a known token, `403 Forbidden` in the API
//! server's words without a grant; SubjectAccessReview reads the same rules.
//! Off by default (everything allowed, the request log says who asked what);
//! the end-to-end `Stack` runs under `deploy/base/rbac.yaml`.
//!
//! Not emulated: RBAC's escalation checks on writing roles, aggregated
//! ClusterRoles, impersonation, admission webhooks, CEL (`x-kubernetes-validations`), the OpenAPI
//! `format`s, validation of built-in kinds beyond the rules listed above
//! (a Pod or a Deployment spec is stored as sent), API priority and
//! fairness, pages from one snapshot (`limit`/`continue` are served, later
//! pages from the current state), table output,
//! protobuf, field managers, conversion between versions, a namespace's
//! `spec.finalizers` kept on update, the scheduler and nodes, pods of
//! anything but Jobs (a Deployment gets no pods), container restarts.
//!
//! HTTPS: the same API is also served over TLS ([`FakeApiServer::https_addr`]),
//! with a cluster CA generated at start ([`FakeApiServer::ca_pem`]), for
//! in-cluster clients (see `tls`).
//!
//! Jobs: the [`JobRunner`] (`kubelet`) plays the Job controller and the
//! kubelet for the Jobs whose images the test maps to executables: owned
//! Pods, each container a local process with the Job's args, env
//! (`valueFrom` included), volumes and projected ServiceAccount token at
//! their real paths in a mount namespace of its own (`sandbox`), the
//! in-cluster variables naming the HTTPS endpoint; pod and Job status from
//! exit codes, termination messages, `backoffLimit`, `activeDeadlineSeconds`.
//! An unmapped image stays pending. What it does not do is listed there.
//!
//! The [`FakeAgent`] plays the upstream agent: the runner runs the
//! `vynil-fake-agent` executable as the agent image's entrypoint, which
//! reads its instance in-cluster through upstream's types and, as the
//! test's script says, writes the status the upstream agent would write and
//! exits 0, fails with a termination message, or hangs; reaper Jobs run the
//! real lifecycle binary.

mod access;
mod admission;
mod agent;
mod instant;
mod kubelet;
mod rbac;
mod resources;
pub mod sandbox;
mod selectors;
mod server;
mod store;
mod tls;

pub use access::{AccessRule, AccessTable, ApiFault, ApiFaultAction, Identity, RequestRecord};
pub use agent::{
    AgentJob, AgentOutcome, AgentRun, FakeAgent, REAPER_IMAGE, UNPACK_USER_AGENT, UPSTREAM_AGENT_IMAGE,
    agent_main,
};
pub use instant::InstantAgent;
pub use kubelet::{ContainerRun, JobEnv, JobRunner, Program, RunnerOptions};
pub use resources::ResourceDef;
pub use selectors::{FieldSelector, LabelSelector};
pub use server::{ADMIN_TOKEN, FakeApiOptions, FakeApiServer};
