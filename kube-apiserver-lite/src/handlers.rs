//! The verbs: get, list, create, update, patch, delete, deletecollection (watch lives
//! in `watch.rs`), and the rules of the `/status` subresource.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::crds::CustomResource;
use super::custom::{self, FieldValidation};
use super::discovery;
use super::errors::{ApiError, ApiResult};
use super::event_versions;
use super::meta;
use super::openapi;
use super::patch::Patch;
use super::protobuf;
use super::resources::{self, Resource};
use super::routes::{self, Body, Query, ResourceRoute, Route};
use super::selectors::Filter;
use super::store::Change;
use super::table;
use super::tokens;
use super::watch;
use super::Shared;

/// Largest request body accepted (objects are small; this only bounds bad input).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Everything a verb needs from the request.
pub(super) struct Ctx<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) route: ResourceRoute,
    pub(super) query: Query,
    accept: String,
    content_type: String,
    /// The `Authorization` header (only SelfSubjectReview reads it: no authentication).
    pub(super) authorization: String,
    body: Bytes,
}

pub async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let header_str = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let accept = header_str(header::ACCEPT);
    let content_type = header_str(header::CONTENT_TYPE);
    let authorization = header_str(header::AUTHORIZATION);
    let query = Query::parse(parts.uri.query());
    tracing::debug!(method = %parts.method, uri = %parts.uri, "request");
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return routes::error_response(&ApiError::bad_request(format!(
                "cannot read the request body: {e}"
            )))
        }
    };
    let route = match routes::parse(parts.uri.path(), &shared.catalog) {
        Route::Resource(route) => route,
        other => return serve_static(&shared, other, &parts.method, &accept),
    };
    let ctx = Ctx {
        shared: &shared,
        route,
        query,
        accept,
        content_type,
        authorization,
        body,
    };
    let result = dispatch(&ctx, &parts.method).await;
    match result {
        Ok(response) => response,
        Err(err) => routes::error_response(&err),
    }
}

/// Discovery, version and health documents.
fn serve_static(shared: &Shared, route: Route, method: &Method, accept: &str) -> Response<Body> {
    if route == Route::NotFound {
        return routes::error_response(&ApiError::path_not_found());
    }
    if method != Method::GET {
        return routes::error_response(&ApiError::method_not_allowed(method.as_str()));
    }
    let doc = match route {
        Route::Version => Some(discovery::version()),
        Route::Health => {
            return Response::builder()
                .header(header::CONTENT_TYPE, "text/plain")
                .body(routes::full("ok"))
                .unwrap_or_else(|_| Response::new(routes::full("ok")));
        }
        Route::OpenApiV2 => return openapi::v2(accept),
        Route::CoreVersions => Some(discovery::core_versions(&shared.addr.to_string())),
        Route::Groups => Some(discovery::group_list(&shared.catalog)),
        Route::Group(g) => discovery::group(&shared.catalog, &g),
        Route::GroupVersion(g, v) => discovery::resource_list(&shared.catalog, &g, &v),
        Route::OpenApiV3(segments) => openapi::lookup(
            &shared.catalog,
            &segments.iter().map(String::as_str).collect::<Vec<_>>(),
        ),
        Route::OpenIdConfiguration => Some(
            shared
                .tokens
                .openid_configuration(&format!("http://{}", shared.addr)),
        ),
        Route::Jwks => Some(shared.tokens.jwks()),
        Route::NotFound | Route::Resource(_) => None,
    };
    match doc {
        Some(doc) => routes::json_response(200, &doc),
        None => routes::error_response(&ApiError::path_not_found()),
    }
}

async fn dispatch(ctx: &Ctx<'_>, method: &Method) -> ApiResult<Response<Body>> {
    if let Some(served) = tokens::dispatch(ctx, method) {
        return served;
    }
    if let Some(served) = super::pod_logs::dispatch(ctx, method).await {
        return served;
    }
    let r = &ctx.route;
    if let Some(sub) = &r.subresource {
        if sub != "status" || !r.rs.status {
            return Err(ApiError::path_not_found());
        }
    }
    if r.rs.namespaced && r.namespace.is_none() && r.name.is_some() {
        return Err(ApiError::path_not_found());
    }
    let is_status = r.subresource.is_some();
    match (method.clone(), r.name.is_some()) {
        (Method::GET, false) if ctx.query.flag("watch") => {
            let filter = filter(&ctx.query)?;
            Ok(watch::serve(
                ctx.shared.clone(),
                r.rs,
                &r.version,
                r.namespace.clone(),
                filter,
                &ctx.query,
                table::wants_table(&ctx.accept),
            ))
        }
        (Method::GET, false) => list(ctx),
        (Method::GET, true) => get(ctx),
        (Method::POST, false) if !is_status && (r.namespace.is_some() || !r.rs.namespaced) => {
            create(ctx)
        }
        (Method::PUT, true) => update(ctx),
        (Method::PATCH, true) => patch(ctx),
        (Method::DELETE, true) if !is_status => delete(ctx),
        (Method::DELETE, false) if !is_status => delete_collection(ctx),
        (m, _) => Err(ApiError::method_not_allowed(m.as_str())),
    }
}

fn filter(query: &Query) -> ApiResult<Filter> {
    Filter::parse(query.get("labelSelector"), query.get("fieldSelector"))
        .map_err(ApiError::bad_request)
}

/// An object as sent to clients: `apiVersion` and `kind` of the requested version first.
pub fn present(rs: &Resource, version: &str, obj: &Value) -> Value {
    let converted;
    let obj = if rs.group == "events.k8s.io" {
        converted = event_versions::to_events_v1(obj);
        &converted
    } else {
        obj
    };
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(rs.api_version(version)));
    out.insert("kind".into(), json!(rs.kind));
    if let Some(fields) = obj.as_object() {
        for (k, v) in fields
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind"))
        {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

fn ns(ctx: &Ctx<'_>) -> String {
    ctx.route.namespace.clone().unwrap_or_default()
}

fn name(ctx: &Ctx<'_>) -> String {
    ctx.route.name.clone().unwrap_or_default()
}

fn dry_run(ctx: &Ctx<'_>) -> bool {
    ctx.query.get("dryRun").is_some_and(|v| !v.is_empty())
}

fn respond(ctx: &Ctx<'_>, status: u16, objects: &[Value], rv: &str) -> Response<Body> {
    let r = &ctx.route;
    let presented: Vec<Value> = objects
        .iter()
        .map(|o| present(r.rs, &r.version, o))
        .collect();
    if table::wants_table(&ctx.accept) {
        let custom = custom_resource(ctx);
        let columns = custom
            .as_ref()
            .and_then(|c| c.version(&r.version))
            .map(|v| v.columns.as_slice());
        return routes::json_response(status, &table::render(r.rs, columns, &presented, rv));
    }
    match presented.as_slice() {
        [one] if r.name.is_some() => routes::json_response(status, one),
        _ => routes::json_response(
            status,
            &json!({
                "apiVersion": r.rs.api_version(&r.version),
                "kind": r.rs.list_kind(),
                "metadata": {"resourceVersion": rv},
                "items": presented,
            }),
        ),
    }
}

fn get(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let obj = ctx
        .shared
        .store
        .get(ctx.route.rs, &ns(ctx), &name(ctx))
        .ok_or_else(|| ApiError::not_found(ctx.route.rs.group, ctx.route.rs.plural, &name(ctx)))?;
    let rv = meta::resource_version_of(&obj).to_string();
    Ok(respond(ctx, 200, &[obj], &rv))
}

/// `limit`/`continue` are ignored: every list is one complete page.
fn list(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let filter = filter(&ctx.query)?;
    let (items, rv) = ctx
        .shared
        .store
        .list(ctx.route.rs, ctx.route.namespace.as_deref(), &filter);
    Ok(respond(ctx, 200, &items, &rv.to_string()))
}

/// The request body as an object: JSON, or YAML when the Content-Type says so.
fn body_object(ctx: &Ctx<'_>) -> ApiResult<Value> {
    let value = decode_body(ctx)?;
    check_shape(ctx, &value)?;
    Ok(to_storage(ctx.route.rs, value))
}

/// An object of `rs` in the form it is stored in (Events: the core form).
fn to_storage(rs: &Resource, value: Value) -> Value {
    if rs.group == "events.k8s.io" {
        event_versions::to_core(&value)
    } else {
        value
    }
}

/// The request body decoded by its Content-Type (JSON, YAML or kubectl's protobuf).
pub(super) fn decode_body(ctx: &Ctx<'_>) -> ApiResult<Value> {
    let ct = ctx.content_type.to_ascii_lowercase();
    let value: Value = if ct.contains("protobuf") {
        protobuf::decode(&ctx.body)
            .map_err(|e| ApiError::unsupported_media_type(&format!("{}: {e}", ctx.content_type)))?
    } else if ct.contains("yaml") {
        serde_yaml::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("invalid YAML body: {e}")))?
    } else if ct.is_empty() || ct.contains("json") {
        serde_json::from_slice(&ctx.body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    } else {
        return Err(ApiError::unsupported_media_type(&ctx.content_type));
    };
    Ok(value)
}

/// Kind, apiVersion and namespace in a body must agree with the URL.
fn check_shape(ctx: &Ctx<'_>, value: &Value) -> ApiResult<()> {
    let rs = ctx.route.rs;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    if let Some(kind) = value.get("kind").and_then(Value::as_str) {
        if kind != rs.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the body ({kind}) does not match the resource ({})",
                rs.kind
            )));
        }
    }
    if let Some(api_version) = value.get("apiVersion").and_then(Value::as_str) {
        if !rs.versions.iter().any(|v| rs.api_version(v) == api_version) {
            return Err(ApiError::bad_request(format!("the API version in the data ({api_version}) does not match the expected API version ({})", rs.api_version(&ctx.route.version))));
        }
    }
    let body_ns = meta::namespace_of(value);
    if rs.namespaced && !body_ns.is_empty() && body_ns != ns(ctx) {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

fn create(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let rs = ctx.route.rs;
    let mut obj = body_object(ctx)?;
    let mut name = meta::name_of(&obj).to_string();
    if name.is_empty() {
        if let Some(prefix) = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        {
            name = meta::generate_name(prefix);
        }
    }
    meta::validate_name(rs, &name)?;
    let mut warnings = Vec::new();
    if let Some(custom) = custom_resource(ctx) {
        custom::check_not_terminating(&custom)?;
        custom::on_create(&custom, &mut obj);
        warnings = custom::admit(
            &custom,
            &ctx.route.version,
            &name,
            &mut obj,
            FieldValidation::of(&ctx.query)?,
        )?;
    }
    let others = crd_others(ctx);
    let created = ctx
        .shared
        .store
        .mutate(rs, &ns(ctx), &name, dry_run(ctx), |_| {
            if is_crd(rs) {
                obj = custom::admit_crd(obj, &others, None)?;
            }
            Ok(Change::Create(obj))
        })?;
    follow_crd(ctx, &created);
    let rv = meta::resource_version_of(&created).to_string();
    Ok(with_warnings(
        respond_one(ctx, 201, created, &rv),
        &warnings,
    ))
}

/// The CRD-defined resource a request is about, if it is one.
fn custom_resource(ctx: &Ctx<'_>) -> Option<Arc<CustomResource>> {
    let rs = ctx.route.rs;
    resources::builtin_by_storage(rs.group, rs.plural)
        .is_none()
        .then(|| ctx.shared.catalog.custom(rs.group, rs.plural))
        .flatten()
}

fn is_crd(rs: &Resource) -> bool {
    std::ptr::eq(rs, resources::crds())
}

/// Every stored CRD, for a CRD write's name-conflict check (none for other writes).
fn crd_others(ctx: &Ctx<'_>) -> Vec<Value> {
    if !is_crd(ctx.route.rs) {
        return Vec::new();
    }
    ctx.shared
        .store
        .list(resources::crds(), None, &Filter::default())
        .0
}

/// After a CRD write: serve (or stop serving) what it defines.
fn follow_crd(ctx: &Ctx<'_>, crd: &Value) {
    if is_crd(ctx.route.rs) && !dry_run(ctx) {
        ctx.shared.catalog.sync(crd);
        ctx.shared.crds_changed.send_modify(|n| *n += 1);
    }
}

/// `Warning: 299 - "<text>"` headers, one per warning, as kube-apiserver sends them.
fn with_warnings(mut response: Response<Body>, warnings: &[String]) -> Response<Body> {
    for warning in warnings {
        let text = format!("299 - {:?}", warning);
        if let Ok(value) = http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

fn respond_one(ctx: &Ctx<'_>, status: u16, obj: Value, rv: &str) -> Response<Body> {
    let r = &ctx.route;
    if table::wants_table(&ctx.accept) {
        return respond(ctx, status, &[obj], rv);
    }
    routes::json_response(status, &present(r.rs, &r.version, &obj))
}

/// The object a write produces, given the `/status` rules: the main resource keeps
/// the stored `.status`; the status subresource changes only `.status` and metadata
/// labels and annotations (as the real pods/status does; Istio's CNI agent annotates
/// pods that way), carrying the caller's resourceVersion for the conflict check.
fn with_subresource_rules(rs: &Resource, status: bool, old: &Value, candidate: Value) -> Value {
    if status && resources::builtin_by_storage(rs.group, rs.plural).is_none() {
        return custom::status_write(old, &candidate);
    }
    if status {
        let mut out = old.clone();
        for pointer in [
            "/status",
            "/metadata/labels",
            "/metadata/annotations",
            "/metadata/resourceVersion",
        ] {
            let (parent, field) = pointer.rsplit_once('/').unwrap_or(("", pointer));
            match candidate.pointer(pointer) {
                Some(v) => meta::set_path(&mut out, pointer, v.clone()),
                None => {
                    if let Some(m) = out.pointer_mut(parent).and_then(Value::as_object_mut) {
                        m.remove(field);
                    } else if parent.is_empty() {
                        if let Some(m) = out.as_object_mut() {
                            m.remove(field);
                        }
                    }
                }
            }
        }
        return out;
    }
    let mut out = candidate;
    if rs.status {
        match (old.get("status"), out.as_object_mut()) {
            (Some(s), Some(m)) => {
                m.insert("status".into(), s.clone());
            }
            (None, Some(m)) => {
                m.remove("status");
            }
            _ => {}
        }
    }
    out
}

fn update(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let rs = ctx.route.rs;
    let name = name(ctx);
    let obj = body_object(ctx)?;
    let body_name = meta::name_of(&obj);
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let status = ctx.route.subresource.is_some();
    let custom = custom_resource(ctx);
    let validation = FieldValidation::of(&ctx.query)?;
    let others = crd_others(ctx);
    let mut warnings = Vec::new();
    let updated = ctx
        .shared
        .store
        .mutate(rs, &ns(ctx), &name, dry_run(ctx), |cur| {
            let old = cur.ok_or_else(|| ApiError::not_found(rs.group, rs.plural, &name))?;
            let mut new = with_subresource_rules(rs, status, old, obj);
            if let Some(custom) = &custom {
                warnings = custom::admit(custom, &ctx.route.version, &name, &mut new, validation)?;
            }
            if is_crd(rs) {
                new = custom::admit_crd(new, &others, Some(old))?;
            }
            Ok(Change::Update(new))
        })?;
    follow_crd(ctx, &updated);
    let rv = meta::resource_version_of(&updated).to_string();
    Ok(with_warnings(
        respond_one(ctx, 200, updated, &rv),
        &warnings,
    ))
}

fn patch(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let rs = ctx.route.rs;
    let name = name(ctx);
    let patch = Patch::parse(&ctx.content_type, &ctx.body)?;
    let custom = custom_resource(ctx);
    if matches!(patch, Patch::Strategic(_)) && custom.is_some() {
        // As for any custom resource on a real server.
        return Err(ApiError::unsupported_media_type(
            "application/strategic-merge-patch+json (not supported for custom resources)",
        ));
    }
    if let Patch::Apply(applied) = &patch {
        if ctx.query.get("fieldManager").is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                "PatchOptions",
                "",
                "fieldManager: Required value: is required for apply patch",
            ));
        }
        check_shape(ctx, applied)?;
    }
    let status = ctx.route.subresource.is_some();
    let validation = FieldValidation::of(&ctx.query)?;
    let others = crd_others(ctx);
    let mut created = false;
    let mut warnings = Vec::new();
    let result = ctx
        .shared
        .store
        .mutate(rs, &ns(ctx), &name, dry_run(ctx), |cur| {
            let change = match (cur, &patch) {
                (None, Patch::Apply(applied)) if !status => {
                    created = true;
                    let mut obj = applied.clone();
                    meta::set_path(&mut obj, "/metadata/name", json!(name));
                    if let Some(custom) = &custom {
                        custom::check_not_terminating(custom)?;
                        custom::on_create(custom, &mut obj);
                    }
                    Ok(Change::Create(obj))
                }
                (None, _) => Err(ApiError::not_found(rs.group, rs.plural, &name)),
                (Some(old), patch) => {
                    // A patch is written against the form the client sees.
                    let patched = if rs.group == "events.k8s.io" {
                        patch
                            .apply_to(&event_versions::to_events_v1(old))
                            .map(|p| event_versions::to_core(&p))
                    } else {
                        patch.apply_to(old)
                    };
                    let patched = patched.map_err(|e| ApiError::invalid(rs.kind, &name, e))?;
                    if !patched.is_object() {
                        return Err(ApiError::invalid(
                            rs.kind,
                            &name,
                            "the patch does not leave an object",
                        ));
                    }
                    Ok(Change::Update(with_subresource_rules(
                        rs, status, old, patched,
                    )))
                }
            }?;
            // What the patch leaves goes through the same checks as a full write.
            Ok(match change {
                Change::Create(mut obj) | Change::Update(mut obj) => {
                    if let Some(custom) = &custom {
                        warnings =
                            custom::admit(custom, &ctx.route.version, &name, &mut obj, validation)?;
                    }
                    if is_crd(rs) {
                        obj = custom::admit_crd(obj, &others, cur)?;
                    }
                    if created {
                        Change::Create(obj)
                    } else {
                        Change::Update(obj)
                    }
                }
                Change::Delete => Change::Delete,
            })
        })?;
    follow_crd(ctx, &result);
    let rv = meta::resource_version_of(&result).to_string();
    Ok(with_warnings(
        respond_one(ctx, if created { 201 } else { 200 }, result, &rv),
        &warnings,
    ))
}

/// Deletion is immediate (no graceful period, no finalizers), except namespaces:
/// they turn Terminating and, after `Options::namespace_finalize_delay`, go away
/// with everything in them (so `kubectl delete -f` of a namespace and its objects
/// succeeds as on a real cluster).
fn delete(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let rs = ctx.route.rs;
    let name = name(ctx);
    if is_crd(rs) && !dry_run(ctx) {
        return delete_crd(ctx, &name);
    }
    let deleted = ctx
        .shared
        .store
        .mutate(rs, &ns(ctx), &name, dry_run(ctx), |cur| {
            cur.map(|_| Change::Delete)
                .ok_or_else(|| ApiError::not_found(rs.group, rs.plural, &name))
        })?;
    schedule_namespace_finalizer(ctx, &deleted);
    let rv = meta::resource_version_of(&deleted).to_string();
    Ok(respond_one(ctx, 200, deleted, &rv))
}

/// Deletes a CRD as kube-apiserver does, without the wait: it turns Terminating (no new
/// objects), every object it defines is deleted (watchers see each go), then the CRD
/// goes and what it defined is no longer served (open watches on it end).
fn delete_crd(ctx: &Ctx<'_>, name: &str) -> ApiResult<Response<Body>> {
    let crds = resources::crds();
    let store = &ctx.shared.store;
    let terminating = store.mutate(crds, "", name, false, |cur| {
        let cur = cur.ok_or_else(|| ApiError::not_found(crds.group, crds.plural, name))?;
        Ok(Change::Update(crate::crds::terminating(cur)))
    })?;
    ctx.shared.catalog.sync(&terminating);
    let (group, plural) = crate::crds::group_and_plural(&terminating);
    if let Some(custom) = ctx.shared.catalog.custom(&group, &plural) {
        let (instances, _) = store.list(custom.resource, None, &Filter::default());
        for obj in instances {
            // One deleted meanwhile is gone either way.
            let _ = store.mutate(
                custom.resource,
                meta::namespace_of(&obj),
                meta::name_of(&obj),
                false,
                |cur| {
                    cur.map(|_| Change::Delete)
                        .ok_or_else(|| ApiError::not_found(&group, &plural, ""))
                },
            );
        }
    }
    let deleted = store.mutate(crds, "", name, false, |cur| {
        cur.map(|_| Change::Delete)
            .ok_or_else(|| ApiError::not_found(crds.group, crds.plural, name))
    })?;
    ctx.shared.catalog.remove(&deleted);
    ctx.shared.crds_changed.send_modify(|n| *n += 1);
    let rv = meta::resource_version_of(&terminating).to_string();
    Ok(respond_one(ctx, 200, terminating, &rv))
}

fn schedule_namespace_finalizer(ctx: &Ctx<'_>, deleted: &Value) {
    if !std::ptr::eq(ctx.route.rs, resources::namespaces()) || dry_run(ctx) {
        return;
    }
    let shared = ctx.shared.clone();
    let name = meta::name_of(deleted).to_string();
    let uid = deleted
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    tokio::spawn(async move {
        tokio::time::sleep(shared.options.namespace_finalize_delay).await;
        shared.store.finalize_namespace(&name, &uid);
    });
}

fn delete_collection(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let rs = ctx.route.rs;
    let filter = filter(&ctx.query)?;
    let (items, _) = ctx
        .shared
        .store
        .list(rs, ctx.route.namespace.as_deref(), &filter);
    let mut deleted = Vec::new();
    for item in items {
        let result = ctx.shared.store.mutate(
            rs,
            meta::namespace_of(&item),
            meta::name_of(&item),
            dry_run(ctx),
            |cur| {
                cur.map(|_| Change::Delete)
                    .ok_or_else(|| ApiError::not_found(rs.group, rs.plural, ""))
            },
        );
        // An object deleted meanwhile is simply not in the answer.
        if let Ok(obj) = result {
            schedule_namespace_finalizer(ctx, &obj);
            deleted.push(obj);
        }
    }
    let rv = ctx.shared.store.resource_version().to_string();
    Ok(respond(ctx, 200, &deleted, &rv))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin as find;

    #[test]
    fn status_rules() {
        let pods = find("", "v1", "pods").unwrap();
        let old = json!({"metadata": {"name": "p", "resourceVersion": "5", "labels": {"a": "1"}, "ownerReferences": [{"uid": "x"}]},
                         "spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}});
        let candidate = json!({"metadata": {"name": "p", "annotations": {"ambient.istio.io/redirection": "enabled"}, "ownerReferences": []},
                               "spec": {"nodeName": "n2"}, "status": {"phase": "Running"}});
        let status = with_subresource_rules(pods, true, &old, candidate.clone());
        assert_eq!(status["spec"]["nodeName"], "n1");
        assert_eq!(status["status"]["phase"], "Running");
        assert_eq!(
            status["metadata"]["annotations"]["ambient.istio.io/redirection"],
            "enabled"
        );
        assert!(status["metadata"].get("labels").is_none());
        assert!(status["metadata"].get("resourceVersion").is_none());
        assert_eq!(status["metadata"]["ownerReferences"][0]["uid"], "x");
        let main = with_subresource_rules(pods, false, &old, candidate);
        assert_eq!(main["spec"]["nodeName"], "n2");
        assert_eq!(main["status"]["phase"], "Pending");
    }
}
