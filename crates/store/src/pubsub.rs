//! Following a Redis pub/sub channel across outages: one loop, used by the
//! status-change relay, the catalog's invalidations and the scanner's
//! wake-ups. A subscription lost with its connection is made again once
//! Redis answers (on the primary the sentinels name then, after a failover); what was published meanwhile is gone, so the follower is
//! told ([`Message::Resumed`]) and repairs by re-reading.

use std::time::Duration;

use tokio::sync::mpsc;

/// What a followed channel delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A published payload.
    Payload(String),
    /// Subscribed again after an outage: messages may have been missed.
    Resumed,
}

const RETRY: Duration = Duration::from_millis(250);

/// Subscribes to `channel` (the first subscription is made before this
/// returns, so nothing published afterwards is missed) and follows it until
/// the receiver is dropped.
pub async fn follow(
    target: crate::RedisTarget,
    channel: &'static str,
) -> Result<mpsc::Receiver<Message>, crate::StoreError> {
    let mut first = target.client().await?.get_async_pubsub().await.map_err(crate::redis_error)?;
    first.subscribe(channel).await.map_err(crate::redis_error)?;
    let (sender, receiver) = mpsc::channel(1024);
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut subscribed = Some(first);
        loop {
            if let Some(pubsub) = subscribed.take() {
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let payload: String = message.get_payload().unwrap_or_default();
                    if sender.send(Message::Payload(payload)).await.is_err() {
                        return;
                    }
                }
            }
            if sender.is_closed() {
                return;
            }
            tokio::time::sleep(RETRY).await;
            let again = match target.client().await {
                Ok(client) => client.get_async_pubsub().await.ok(),
                Err(_) => None,
            };
            if let Some(mut again) = again
                && again.subscribe(channel).await.is_ok()
            {
                tracing::info!(channel, "pub/sub subscription resumed");
                if sender.send(Message::Resumed).await.is_err() {
                    return;
                }
                subscribed = Some(again);
            }
        }
    });
    Ok(receiver)
}
