//! Where an index lives: a JukeBox's `http` or `s3` source with its secret's
//! credentials, or an export destination (`s3://…`, `http(s)://…`, a
//! directory), each opened as an `object_store` store and a prefix in it.

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use base64::Engine;
use object_store::{
    ClientOptions, ObjectStore, aws::AmazonS3Builder, http::HttpBuilder, local::LocalFileSystem, path::Path,
};

use crate::{IndexError, Result};

/// Upstream's timeout for index reads (§3.8).
const TIMEOUT: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How an HTTP index is authenticated.
#[derive(Clone, PartialEq, Eq)]
pub enum Authorization {
    Bearer(String),
    Basic { username: String, password: String },
}

impl fmt::Debug for Authorization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Authorization::Bearer(_) => "Bearer(…)",
            Authorization::Basic { .. } => "Basic(…)",
        })
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "S3Credentials({}, …)", self.access_key_id)
    }
}

/// An index's home.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Directory(std::path::PathBuf),
    /// `url` holds `index.yaml`.
    Http {
        url: String,
        authorization: Option<Authorization>,
    },
    S3 {
        bucket: String,
        region: String,
        prefix: Option<String>,
        /// An S3-compatible endpoint (MinIO, Ceph…): requests are then
        /// path-style (`<endpoint>/<bucket>/<key>`).
        endpoint: Option<String>,
        /// `None`: the ambient chain (environment, web identity, instance
        /// metadata), as upstream without a secret.
        credentials: Option<S3Credentials>,
    },
}

impl Location {
    /// An export destination: `s3://<bucket>[/<prefix>][?region=…&endpoint=…]`,
    /// `http(s)://…` (PUT and DELETE), `file://<dir>` or a directory path.
    pub fn parse(destination: &str) -> Result<Self> {
        let invalid = |problem: &str| IndexError::InvalidLocation {
            location: destination.to_string(),
            problem: problem.to_string(),
        };
        if destination.starts_with("http://") || destination.starts_with("https://") {
            return Ok(Location::Http { url: destination.to_string(), authorization: None });
        }
        if let Some(rest) = destination.strip_prefix("file://") {
            return Ok(Location::Directory(rest.into()));
        }
        if destination.starts_with("s3://") {
            let url = url::Url::parse(destination).map_err(|e| invalid(&e.to_string()))?;
            let bucket =
                url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| invalid("names no bucket"))?;
            let query: BTreeMap<String, String> = url.query_pairs().into_owned().collect();
            if let Some(unknown) = query.keys().find(|k| !matches!(k.as_str(), "region" | "endpoint")) {
                return Err(invalid(&format!(
                    "has an unknown parameter {unknown:?} (region and endpoint are known)"
                )));
            }
            let prefix = url.path().trim_matches('/');
            return Ok(Location::S3 {
                bucket: bucket.to_string(),
                region: query.get("region").cloned().unwrap_or_else(|| "us-east-1".into()),
                prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
                endpoint: query.get("endpoint").cloned(),
                credentials: None,
            });
        }
        if destination.contains("://") {
            return Err(invalid("use s3://, http://, https://, file:// or a directory path"));
        }
        if destination.is_empty() {
            return Err(invalid("is empty"));
        }
        Ok(Location::Directory(destination.into()))
    }

    /// The same location with the credentials of a Secret's `data`, in
    /// upstream's keys: `token` (Bearer) or `username` + `password` (Basic)
    /// for HTTP; `access_key_id` + `secret_access_key` (and optional
    /// `session_token`) for S3.
    pub fn with_secret(self, secret: &str, data: &BTreeMap<String, Vec<u8>>) -> Result<Self> {
        let text = |key: &str| -> Result<Option<String>> {
            data.get(key)
                .map(|bytes| {
                    String::from_utf8(bytes.clone()).map(|s| s.trim().to_string()).map_err(|_| {
                        IndexError::Secret {
                            secret: secret.to_string(),
                            problem: format!("key {key:?} is not UTF-8"),
                        }
                    })
                })
                .transpose()
        };
        let missing =
            |problem: &str| IndexError::Secret { secret: secret.to_string(), problem: problem.to_string() };
        match self {
            Location::Http { url, .. } => {
                let authorization = match (text("token")?, text("username")?, text("password")?) {
                    (Some(token), _, _) => Authorization::Bearer(token),
                    (None, Some(username), Some(password)) => Authorization::Basic { username, password },
                    _ => return Err(missing("has neither `token` nor `username` and `password`")),
                };
                Ok(Location::Http { url, authorization: Some(authorization) })
            }
            Location::S3 { bucket, region, prefix, endpoint, .. } => {
                let (Some(access_key_id), Some(secret_access_key)) =
                    (text("access_key_id")?, text("secret_access_key")?)
                else {
                    return Err(missing("lacks `access_key_id` or `secret_access_key`"));
                };
                let credentials =
                    S3Credentials { access_key_id, secret_access_key, session_token: text("session_token")? };
                Ok(Location::S3 { bucket, region, prefix, endpoint, credentials: Some(credentials) })
            }
            directory @ Location::Directory(_) => Ok(directory),
        }
    }

    /// The URL whose host requests with this location's credentials go to:
    /// the HTTP index's own, an S3 bucket's endpoint (AWS's regional one
    /// without `endpoint`, as `object_store` reaches it path-style); `None`
    /// for a directory. A credential's host check reads this parsed URL,
    /// never the written text.
    pub fn contacted(&self) -> Result<Option<url::Url>> {
        let invalid = |problem: String| IndexError::InvalidLocation { location: self.to_string(), problem };
        let url = match self {
            Location::Directory(_) => return Ok(None),
            Location::Http { url, .. } => url.clone(),
            Location::S3 { endpoint: Some(endpoint), .. } => endpoint.clone(),
            Location::S3 { bucket, .. } if bucket.ends_with("--x-s3") => {
                return Err(invalid(
                    "names an S3 Express bucket, whose zonal endpoint is not supported".into(),
                ));
            }
            Location::S3 { region, endpoint: None, .. } => format!("https://s3.{region}.amazonaws.com"),
        };
        url::Url::parse(&url).map(Some).map_err(|e| invalid(format!("{url:?} is not a URL: {e}")))
    }

    /// The store and the prefix of the index in it.
    pub(crate) fn open(&self) -> Result<(Arc<dyn ObjectStore>, Path)> {
        let invalid = |problem: String| IndexError::InvalidLocation { location: self.to_string(), problem };
        let options = || {
            ClientOptions::new()
                .with_timeout(TIMEOUT)
                .with_connect_timeout(CONNECT_TIMEOUT)
                .with_allow_http(true)
                .with_user_agent(http::HeaderValue::from_static("vynil-index"))
        };
        match self {
            Location::Directory(path) => {
                std::fs::create_dir_all(path).map_err(|e| invalid(format!("cannot create it: {e}")))?;
                let store = LocalFileSystem::new_with_prefix(path).map_err(|e| invalid(e.to_string()))?;
                Ok((Arc::new(store), Path::default()))
            }
            Location::Http { url, authorization } => {
                // The store at the origin, the URL's path as the prefix:
                // `object_store` joins paths by segment.
                let parsed =
                    url::Url::parse(url.trim_end_matches('/')).map_err(|e| invalid(e.to_string()))?;
                let origin = parsed.origin().ascii_serialization();
                let mut options = options();
                if let Some(authorization) = authorization {
                    let value = match authorization {
                        Authorization::Bearer(token) => format!("Bearer {token}"),
                        Authorization::Basic { username, password } => format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD
                                .encode(format!("{username}:{password}"))
                        ),
                    };
                    let mut value = http::HeaderValue::from_str(&value)
                        .map_err(|_| invalid("unusable credentials".into()))?;
                    value.set_sensitive(true);
                    let mut headers = http::HeaderMap::new();
                    headers.insert(http::header::AUTHORIZATION, value);
                    options = options.with_default_headers(headers);
                }
                let store = HttpBuilder::new()
                    .with_url(origin)
                    .with_client_options(options)
                    .build()
                    .map_err(|e| invalid(e.to_string()))?;
                Ok((Arc::new(store), Path::from(parsed.path().trim_matches('/'))))
            }
            Location::S3 { bucket, region, prefix, endpoint, credentials } => {
                let mut builder = match credentials {
                    Some(_) => AmazonS3Builder::new(),
                    None => AmazonS3Builder::from_env(),
                }
                .with_bucket_name(bucket)
                .with_region(region)
                .with_client_options(options());
                if let Some(endpoint) = endpoint {
                    builder = builder
                        .with_endpoint(endpoint.trim_end_matches('/'))
                        .with_virtual_hosted_style_request(false);
                }
                if let Some(credentials) = credentials {
                    builder = builder
                        .with_access_key_id(&credentials.access_key_id)
                        .with_secret_access_key(&credentials.secret_access_key);
                    if let Some(token) = &credentials.session_token {
                        builder = builder.with_token(token);
                    }
                }
                let store = builder.build().map_err(|e| invalid(e.to_string()))?;
                Ok((Arc::new(store), Path::from(prefix.as_deref().unwrap_or_default().trim_matches('/'))))
            }
        }
    }

    /// Where `file` is, as errors and logs name it.
    pub fn describe(&self, file: &str) -> String {
        match self {
            Location::Directory(path) => path.join(file).display().to_string(),
            Location::Http { url, .. } => format!("{}/{file}", url.trim_end_matches('/')),
            Location::S3 { bucket, prefix: Some(prefix), .. } => {
                format!("s3://{bucket}/{}/{file}", prefix.trim_matches('/'))
            }
            Location::S3 { bucket, prefix: None, .. } => format!("s3://{bucket}/{file}"),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let described = self.describe("");
        f.write_str(described.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn destinations_parse_and_a_bad_one_says_what_is_known() {
        let s3 = Location::parse("s3://bucket/team/index?region=eu-west-3&endpoint=http://127.0.0.1:9000")
            .unwrap();
        assert_eq!(
            s3,
            Location::S3 {
                bucket: "bucket".into(),
                region: "eu-west-3".into(),
                prefix: Some("team/index".into()),
                endpoint: Some("http://127.0.0.1:9000".into()),
                credentials: None
            }
        );
        assert_eq!(Location::parse("out/index").unwrap(), Location::Directory("out/index".into()));
        let error = Location::parse("s3://bucket?zone=x").unwrap_err();
        assert!(error.to_string().contains("\"zone\""), "{error}");
        assert!(Location::parse("ftp://x").is_err());
    }

    #[test]
    fn secrets_give_upstreams_credentials_or_say_what_is_missing() {
        let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<u8>> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
        };
        let http = Location::Http { url: "https://h/i".into(), authorization: None };
        let bearer = http.clone().with_secret("s", &data(&[("token", "t0k\n")])).unwrap();
        assert!(
            matches!(bearer, Location::Http { authorization: Some(Authorization::Bearer(ref t)), .. } if t == "t0k")
        );
        let error = http.with_secret("s", &data(&[("username", "u")])).unwrap_err();
        assert!(error.to_string().contains("index secret \"s\""), "{error}");
        let s3 = Location::parse("s3://b").unwrap();
        assert!(s3.clone().with_secret("s", &data(&[("access_key_id", "a")])).is_err());
        assert!(s3.with_secret("s", &data(&[("access_key_id", "a"), ("secret_access_key", "b")])).is_ok());
    }
}
