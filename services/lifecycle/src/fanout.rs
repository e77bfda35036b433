//! Catalog fan-out: a changed JukeBox re-reconciles exactly its instances at
//! once (upstream waits for each instance's 15-minute requeue).
//!
//! One `WatchCatalog` subscription per controller; each change of JukeBox
//! `J` yields the instances of that kind whose `spec.jukebox` is `J`, read
//! from the controller's own watch cache. When the catalog goes away the
//! subscription is resumed with backoff (0.5 s doubling to 30 s), and on
//! each resumption every instance of the kind is reconciled once, since
//! changes made while disconnected were not heard.

use std::time::Duration;

use futures::Stream;
use kube::{
    ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::reflector::{ObjectRef, Store},
};
use vynil_runtime::Shutdown;

use crate::catalog_client::Catalog;

const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

fn reference(object: &DynamicObject, resource: &ApiResource) -> ObjectRef<DynamicObject> {
    let reference = ObjectRef::new_with(&object.name_any(), resource.clone());
    match object.namespace() {
        Some(namespace) => reference.within(&namespace),
        None => reference,
    }
}

/// The instances to reconcile after catalog changes, until `shutdown`.
pub fn triggers(
    catalog: Catalog,
    store: Store<DynamicObject>,
    resource: ApiResource,
    shutdown: Shutdown,
) -> impl Stream<Item = ObjectRef<DynamicObject>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move {
        let mut backoff = BACKOFF_FIRST;
        let mut resumed = false;
        loop {
            match catalog.watch().await {
                Ok(mut changes) => {
                    backoff = BACKOFF_FIRST;
                    if resumed {
                        tracing::info!("catalog subscription resumed: reconciling every instance once");
                        for object in store.state() {
                            if tx.send(reference(&object, &resource)).await.is_err() {
                                return;
                            }
                        }
                    }
                    loop {
                        let change = tokio::select! {
                            change = changes.message() => change,
                            () = shutdown.signaled() => return,
                        };
                        let Ok(Some(change)) = change else { break };
                        let jukebox = change.jukebox;
                        for object in store.state() {
                            let of_box = object.data.pointer("/spec/jukebox").and_then(|v| v.as_str())
                                == Some(&jukebox);
                            if of_box && tx.send(reference(&object, &resource)).await.is_err() {
                                return;
                            }
                        }
                    }
                    tracing::warn!("catalog subscription ended; resuming");
                }
                Err(error) => {
                    tracing::warn!(%error, ?backoff, "cannot subscribe to catalog changes; retrying")
                }
            }
            resumed = true;
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shutdown.signaled() => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
