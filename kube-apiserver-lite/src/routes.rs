//! Request plumbing: URL paths to routes, query strings, and JSON responses.

use std::collections::HashMap;
use std::convert::Infallible;

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use serde_json::Value;

use super::catalog::Catalog;
use super::errors::ApiError;
use super::resources::Resource;

/// Response body: a buffer, or the stream of a watch.
pub type Body = BoxBody<Bytes, Infallible>;

/// Where a request goes.
#[derive(Debug, PartialEq)]
pub enum Route {
    Version,
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`
    GroupVersion(String, String),
    /// `/openapi/v2`: an empty document, as kubectl reads it for kinds v3 does not know.
    OpenApiV2,
    /// `/openapi/v3/...` (the segments after `v3`).
    OpenApiV3(Vec<String>),
    /// `/.well-known/openid-configuration` (service account token issuer discovery)
    OpenIdConfiguration,
    /// `/openid/v1/jwks`: the token signing key
    Jwks,
    Resource(ResourceRoute),
    NotFound,
}

/// A path under a resource: collection, object or subresource.
#[derive(Debug, PartialEq)]
pub struct ResourceRoute {
    pub rs: &'static Resource,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

pub fn parse(path: &str, catalog: &Catalog) -> Route {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    match s.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["api", version, rest @ ..] => resource_route(catalog, "", version, rest),
        ["apis"] => Route::Groups,
        ["apis", group] => Route::Group(group.to_string()),
        ["apis", group, version, rest @ ..] => resource_route(catalog, group, version, rest),
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3", rest @ ..] => {
            Route::OpenApiV3(rest.iter().map(|s| s.to_string()).collect())
        }
        [".well-known", "openid-configuration"] => Route::OpenIdConfiguration,
        ["openid", "v1", "jwks"] => Route::Jwks,
        _ => Route::NotFound,
    }
}

fn resource_route(catalog: &Catalog, group: &str, version: &str, rest: &[&str]) -> Route {
    let route = |plural: &str, namespace: Option<&str>, name: Option<&&str>, sub: Option<&&str>| {
        match catalog.find(group, version, plural) {
            Some(rs) if rs.namespaced || namespace.is_none() => Route::Resource(ResourceRoute {
                rs,
                version: version.to_string(),
                namespace: namespace.map(str::to_string),
                name: name.map(|n| n.to_string()),
                subresource: sub.map(|s| s.to_string()),
            }),
            _ => Route::NotFound,
        }
    };
    let namespaced_plural = |p: &str| {
        catalog
            .find(group, version, p)
            .is_some_and(|r| r.namespaced)
    };
    match rest {
        [] => Route::GroupVersion(group.to_string(), version.to_string()),
        ["namespaces", ns, plural, tail @ ..] if tail.len() <= 2 && namespaced_plural(plural) => {
            route(plural, Some(ns), tail.first(), tail.get(1))
        }
        [plural, tail @ ..] if tail.len() <= 2 => route(plural, None, tail.first(), tail.get(1)),
        _ => Route::NotFound,
    }
}

/// Query parameters, percent-decoded (`+` is a space, as Go encodes it).
#[derive(Debug, Default)]
pub struct Query(HashMap<String, String>);

impl Query {
    pub fn parse(query: Option<&str>) -> Query {
        let pairs = form_urlencoded::parse(query.unwrap_or("").as_bytes());
        Query(pairs.into_owned().collect())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// `true`/`1` (how kubectl and client-go spell booleans).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// A path segment, percent-decoded (invalid escapes are kept as they are).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Bytes a query value keeps as they are: RFC 3986's unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes a query value (selectors contain `=`, `,` and `!`).
pub fn query_escape(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, QUERY_VALUE).to_string()
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn json_response(status: u16, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

pub fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code, &err.to_status())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(route: Route) -> (String, Option<String>, Option<String>, Option<String>) {
        match route {
            Route::Resource(r) => (r.rs.plural.to_string(), r.namespace, r.name, r.subresource),
            other => panic!("not a resource route: {other:?}"),
        }
    }

    #[test]
    fn paths() {
        assert_eq!(parse("/version", &Catalog::default()), Route::Version);
        assert_eq!(parse("/api", &Catalog::default()), Route::CoreVersions);
        assert_eq!(
            parse("/api/v1", &Catalog::default()),
            Route::GroupVersion("".into(), "v1".into())
        );
        assert_eq!(
            parse("/apis/apps", &Catalog::default()),
            Route::Group("apps".into())
        );
        assert_eq!(
            res(parse(
                "/api/v1/namespaces/demo/pods/web/status",
                &Catalog::default()
            )),
            (
                "pods".into(),
                Some("demo".into()),
                Some("web".into()),
                Some("status".into())
            )
        );
        assert_eq!(
            res(parse("/api/v1/pods", &Catalog::default())),
            ("pods".into(), None, None, None)
        );
        assert_eq!(
            res(parse("/api/v1/namespaces/demo", &Catalog::default())),
            ("namespaces".into(), None, Some("demo".into()), None)
        );
        assert_eq!(
            res(parse("/api/v1/namespaces/demo/status", &Catalog::default())),
            (
                "namespaces".into(),
                None,
                Some("demo".into()),
                Some("status".into())
            )
        );
        assert_eq!(
            parse(
                "/apis/security.istio.io/v1beta1/namespaces/a/authorizationpolicies/p",
                &Catalog::default()
            ),
            Route::NotFound,
            "a custom kind is not served before its CRD"
        );
        assert_eq!(
            parse("/api/v1/namespaces/demo/nodes/x", &Catalog::default()),
            Route::NotFound
        );
        assert_eq!(
            parse("/api/v1/widgets", &Catalog::default()),
            Route::NotFound
        );
        assert_eq!(
            parse("/api/v1/namespaces/a/pods/b/c/d", &Catalog::default()),
            Route::NotFound
        );
        assert_eq!(parse("/openapi/v2", &Catalog::default()), Route::OpenApiV2);
        assert_eq!(parse("/openid/v1/jwks", &Catalog::default()), Route::Jwks);
        assert_eq!(
            res(parse(
                "/api/v1/namespaces/a/serviceaccounts/b/token",
                &Catalog::default()
            ))
            .3,
            Some("token".into())
        );
        assert_eq!(
            res(parse(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                &Catalog::default()
            ))
            .0,
            "tokenreviews"
        );
        assert_eq!(
            parse("/openapi/v3/api/v1", &Catalog::default()),
            Route::OpenApiV3(vec!["api".into(), "v1".into()])
        );
    }

    #[test]
    fn queries() {
        let q = Query::parse(Some("labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&x"));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
