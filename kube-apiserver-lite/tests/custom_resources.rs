//! Custom resources as kube-apiserver serves them: only while their CRD exists, through
//! its structural schema (422 with field paths, pruning, defaults), with its names,
//! versions, columns and status subresource, and gone with their CRD. Checked with
//! kube-rs and, when installed, a real kubectl.

mod support;

use support::*;
use test_support::poll::eventually;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::Client;
use kube_apiserver_lite::Options;
use serde_json::{json, Value};

const CRD_NAME: &str = "authorizationpolicies.security.istio.io";

/// An AuthorizationPolicy CRD cut down to what these tests need: Istio's names,
/// versions (v1 and v1beta1 served, v1beta1 stored), status subresource and column.
fn policy_crd() -> Value {
    let schema = json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["ALLOW", "DENY", "AUDIT", "CUSTOM"]},
                    "rules": {
                        "type": "array",
                        "maxItems": 512,
                        "items": {
                            "type": "object",
                            "properties": {
                                "when": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["key"],
                                        "properties": {
                                            "key": {"type": "string"},
                                            "values": {"type": "array", "items": {"type": "string"}}
                                        }
                                    }
                                }
                            }
                        }
                    },
                    "provider": {
                        "type": "object",
                        "properties": {"name": {"type": "string", "default": "ext-authz"}}
                    }
                }
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
    });
    let version = |name: &str, storage: bool| {
        json!({
            "name": name, "served": true, "storage": storage,
            "schema": {"openAPIV3Schema": schema},
            "subresources": {"status": {}},
            "additionalPrinterColumns": [
                {"name": "Action", "type": "string", "jsonPath": ".spec.action"},
                {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
            ]
        })
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": "security.istio.io",
            "scope": "Namespaced",
            "names": {
                "kind": "AuthorizationPolicy", "listKind": "AuthorizationPolicyList",
                "plural": "authorizationpolicies", "singular": "authorizationpolicy",
                "shortNames": ["ap"], "categories": ["istio-io", "security-istio-io"]
            },
            "versions": [version("v1", false), version("v1beta1", true)]
        }
    })
}

fn crds(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions"),
    )
}

fn policies(client: &Client, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("security.istio.io", version, "AuthorizationPolicy");
    Api::namespaced_with(
        client.clone(),
        "demo",
        &ApiResource::from_gvk_with_plural(&gvk, "authorizationpolicies"),
    )
}

fn policy(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// The code, reason and message of a refusal.
struct Refusal {
    code: u16,
    reason: String,
    message: String,
}

fn api_status(err: kube::Error) -> Refusal {
    match err {
        kube::Error::Api(status) => Refusal {
            code: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
        },
        other => panic!("expected an API error, got {other}"),
    }
}

async fn create_namespace(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": "demo"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

async fn install_crd(client: &Client) {
    let crd = serde_json::from_value(policy_crd()).unwrap();
    crds(client)
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    eventually("the CRD to be served", WAIT, || async {
        policies(client, "v1")
            .list(&ListParams::default())
            .await
            .is_ok()
    })
    .await;
}

async fn discovery(client: &Client, path: &str) -> Value {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    client.request::<Value>(request).await.unwrap()
}

#[tokio::test]
async fn custom_kinds_are_served_only_while_their_crd_exists() {
    let (control, client) = start(Options::default()).await;
    create_namespace(&client).await;
    let deny_all = policy("deny-all", json!({"action": "DENY", "rules": [{}]}));

    // No CRD: the path is not served and discovery does not know the group.
    let err = policies(&client, "v1")
        .create(&PostParams::default(), &deny_all)
        .await
        .unwrap_err();
    let status = api_status(err);
    assert_eq!(
        (status.code, status.message.as_str()),
        (404, "the server could not find the requested resource")
    );
    let groups = discovery(&client, "/apis").await;
    assert!(
        !groups.to_string().contains("security.istio.io"),
        "{groups}"
    );

    install_crd(&client).await;
    let crd = crds(&client).get(CRD_NAME).await.unwrap();
    let conditions = crd.data["status"]["conditions"].as_array().unwrap().clone();
    for kind in ["NamesAccepted", "Established"] {
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == kind && c["status"] == "True"),
            "{kind} in {conditions:?}"
        );
    }
    assert_eq!(crd.data["status"]["storedVersions"], json!(["v1beta1"]));
    assert_eq!(
        crd.data["status"]["acceptedNames"]["shortNames"],
        json!(["ap"])
    );

    // Discovery: v1 preferred, both versions, the short name, categories and /status.
    let groups = discovery(&client, "/apis").await;
    let group = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "security.istio.io")
        .unwrap_or_else(|| panic!("{groups}"));
    assert_eq!(group["preferredVersion"]["version"], "v1");
    assert_eq!(group["versions"].as_array().unwrap().len(), 2);
    let resources = discovery(&client, "/apis/security.istio.io/v1beta1").await;
    let names: Vec<&str> = resources["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["authorizationpolicies", "authorizationpolicies/status"]
    );
    assert_eq!(resources["resources"][0]["shortNames"], json!(["ap"]));
    assert_eq!(
        resources["resources"][0]["categories"],
        json!(["istio-io", "security-istio-io"])
    );

    // Stored once, read through either version.
    policies(&client, "v1")
        .create(&PostParams::default(), &deny_all)
        .await
        .unwrap();
    let seen = policies(&client, "v1beta1").get("deny-all").await.unwrap();
    assert_eq!(seen.types.unwrap().api_version, "security.istio.io/v1beta1");
    assert_eq!(seen.data["spec"]["action"], "DENY");

    // Deleting the CRD deletes its objects (a watcher sees it) and then the resource.
    let mut watch = policies(&client, "v1")
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    crds(&client)
        .delete(CRD_NAME, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = tokio::time::timeout(WAIT, async {
        while let Some(event) = watch.next().await {
            if let Ok(WatchEvent::Deleted(obj)) = event {
                return obj.metadata.name;
            }
        }
        None
    })
    .await
    .expect("a DELETED event");
    assert_eq!(deleted.as_deref(), Some("deny-all"));
    eventually("the CRD to go", WAIT, || async {
        crds(&client).get_opt(CRD_NAME).await.unwrap().is_none()
    })
    .await;
    let err = policies(&client, "v1").get("deny-all").await.unwrap_err();
    assert_eq!(api_status(err).code, 404);
    let groups = discovery(&client, "/apis").await;
    assert!(
        !groups.to_string().contains("security.istio.io"),
        "{groups}"
    );

    // A new CRD of the same name starts empty.
    install_crd(&client).await;
    let left = policies(&client, "v1")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(left.items.is_empty());
    control.shutdown();
}

#[tokio::test]
async fn objects_go_through_the_crd_schema() {
    let (control, client) = start(Options::default()).await;
    create_namespace(&client).await;
    install_crd(&client).await;
    let api = policies(&client, "v1");

    // An enum violation and a missing required field: 422 with every field path.
    let err = api
        .create(
            &PostParams::default(),
            &policy(
                "maybe",
                json!({"action": "MAYBE", "rules": [{"when": [{"values": ["a"]}]}]}),
            ),
        )
        .await
        .unwrap_err();
    let status = api_status(err);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(
        status.message.starts_with(
            "AuthorizationPolicy.security.istio.io \"maybe\" is invalid: [spec.action: Unsupported value: \"MAYBE\": supported values: \"ALLOW\", \"DENY\", \"AUDIT\", \"CUSTOM\""
        ),
        "{}",
        status.message
    );
    assert!(
        status
            .message
            .contains("spec.rules[0].when[0].key: Required value"),
        "{}",
        status.message
    );
    assert!(api.get_opt("maybe").await.unwrap().is_none());

    // Unknown fields are pruned (the default), refused under Strict; defaults applied.
    let created = api
        .create(
            &PostParams::default(),
            &policy(
                "custom",
                json!({"action": "CUSTOM", "provider": {}, "unknown": 1}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"action": "CUSTOM", "provider": {"name": "ext-authz"}})
    );
    let strict = http::Request::post(
        "/apis/security.istio.io/v1/namespaces/demo/authorizationpolicies?fieldValidation=Strict",
    )
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&policy("strict", json!({"actoin": "DENY"}))).unwrap())
    .unwrap();
    let err = client.request::<Value>(strict).await.unwrap_err();
    let status = api_status(err);
    assert_eq!(status.code, 400);
    assert!(
        status.message.contains("unknown field \"spec.actoin\""),
        "{}",
        status.message
    );

    // A patch that breaks the schema is refused and changes nothing.
    let err = api
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"action": 7}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_status(err).code, 422);
    assert_eq!(
        api.get("custom").await.unwrap().data["spec"]["action"],
        "CUSTOM"
    );

    // Status only through /status; a status write keeps the stored labels and spec.
    let with_status = api
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"x": 1}})),
        )
        .await
        .unwrap();
    assert!(with_status.data.get("status").is_none());
    let after = api
        .patch_status(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"ignored": "yes"}},
                "spec": {"action": "DENY"},
                "status": {"conditions": [{"type": "Reconciled", "status": "True"}]},
            })),
        )
        .await
        .unwrap();
    assert_eq!(after.data["status"]["conditions"][0]["type"], "Reconciled");
    assert_eq!(after.data["spec"]["action"], "CUSTOM");
    assert!(after.metadata.labels.unwrap_or_default().is_empty());
    control.shutdown();
}

#[tokio::test]
async fn a_crd_that_is_not_structural_is_refused() {
    let (control, client) = start(Options::default()).await;
    let mut crd = policy_crd();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("type");
    let err = crds(&client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(crd).unwrap(),
        )
        .await
        .unwrap_err();
    let status = api_status(err);
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains(
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"
        ),
        "{}",
        status.message
    );
    control.shutdown();
}

#[tokio::test]
async fn kubectl_sees_custom_kinds_as_on_a_real_cluster() {
    let Some(bin) = kubectl() else {
        return;
    };
    let (control, client) = start(Options::default()).await;
    create_namespace(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let k = Kubectl::for_server(bin, &control.url(), dir.path());
    let manifest = dir.path().join("policy.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata:\n  name: deny-all\n  namespace: demo\nspec:\n  action: DENY\n",
    )
    .unwrap();
    let manifest = manifest.to_str().unwrap();

    let (ok, _, stderr) = k.try_run(&["apply", "-f", manifest]).await;
    assert!(!ok);
    assert!(
        stderr.contains(
            "no matches for kind \"AuthorizationPolicy\" in version \"security.istio.io/v1\""
        ) && stderr.contains("ensure CRDs are installed first"),
        "{stderr}"
    );

    let crd = dir.path().join("crd.json");
    std::fs::write(&crd, policy_crd().to_string()).unwrap();
    k.run(&["apply", "-f", crd.to_str().unwrap()]).await;
    k.run(&[
        "wait",
        "--for=condition=Established",
        &format!("crd/{CRD_NAME}"),
    ])
    .await;
    let out = k.run(&["apply", "-f", manifest]).await;
    assert!(
        out.contains("authorizationpolicy.security.istio.io/deny-all created"),
        "{out}"
    );
    // The CRD's columns, by short name and by category.
    let out = k.run(&["get", "ap", "-n", "demo"]).await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ACTION", "AGE"], "{out}");
    assert!(out.contains("deny-all") && out.contains("DENY"), "{out}");
    let out = k.run(&["get", "istio-io", "-n", "demo"]).await;
    assert!(out.contains("deny-all") && out.contains("DENY"), "{out}");

    std::fs::write(
        manifest,
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata:\n  name: deny-all\n  namespace: demo\nspec:\n  action: MAYBE\n",
    )
    .unwrap();
    let (ok, _, stderr) = k.try_run(&["apply", "-f", manifest]).await;
    assert!(!ok);
    assert!(
        stderr.contains("spec.action: Unsupported value: \"MAYBE\""),
        "{stderr}"
    );

    k.run(&["delete", "crd", CRD_NAME]).await;
    let (ok, _, stderr) = k.try_run(&["get", "ap", "-n", "demo"]).await;
    assert!(!ok, "{stderr}");
    control.shutdown();
}

/// Every object of a sample file in manifests/testdata.
fn samples(file: &str) -> Vec<Value> {
    use serde::Deserialize;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/testdata")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Creates `obj` as kubectl does (`fieldValidation=Strict`: an unknown field is an
/// error, not pruned in silence).
async fn create_strict(client: &Client, obj: &Value) -> Result<Value, kube::Error> {
    let (group, version) = obj["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap());
    let plural = ApiResource::from_gvk(&gvk).plural;
    let namespace = obj["metadata"]["namespace"]
        .as_str()
        .map(|ns| format!("namespaces/{ns}/"))
        .unwrap_or_default();
    let path = format!("/apis/{group}/{version}/{namespace}{plural}?fieldValidation=Strict");
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(obj).unwrap())
        .unwrap();
    client.request::<Value>(request).await
}

/// The CRDs the base chart ships are structural and established here, and they accept
/// and refuse the same samples `manifests/check.sh` checks against them offline.
#[tokio::test]
async fn the_shipped_crds_serve_their_kinds_and_judge_the_samples() {
    let (_control, client) = start(Options::default()).await;
    let crds = crds(&client);
    let shipped = test_support::crds::shipped().unwrap();
    assert!(shipped.len() >= 7, "{}", shipped.len());
    for crd in &shipped {
        let name = crd["metadata"]["name"].as_str().unwrap();
        let created = crds
            .create(
                &PostParams::default(),
                &serde_json::from_value(crd.clone()).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("{name} refused: {e}"));
        let established = created.data["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True");
        assert!(established, "{name}: {:?}", created.data["status"]);
        let group = crd["spec"]["group"].as_str().unwrap();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let v = version["name"].as_str().unwrap();
            let listed = discovery(&client, &format!("/apis/{group}/{v}")).await;
            let plural = crd["spec"]["names"]["plural"].as_str().unwrap();
            assert!(
                listed["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["name"] == plural),
                "{group}/{v} lists {plural}: {listed}"
            );
        }
    }
    let valid = [
        "authorizationpolicies.yaml",
        "peerauthentications.yaml",
        "gateway-api.yaml",
    ];
    let invalid = valid.map(|f| f.replace(".yaml", "-invalid.yaml"));
    let all = valid
        .iter()
        .map(|f| f.to_string())
        .chain(invalid.iter().cloned());
    let mut namespaces: Vec<String> = all
        .flat_map(|f| samples(&f))
        .filter_map(|o| o["metadata"]["namespace"].as_str().map(str::to_owned))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    for ns in namespaces {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }
    for file in valid {
        for obj in samples(file) {
            let name = format!("{file}: {} {}", obj["kind"], obj["metadata"]["name"]);
            create_strict(&client, &obj)
                .await
                .unwrap_or_else(|e| panic!("{name} refused: {e}"));
        }
    }
    for file in &invalid {
        for obj in samples(file) {
            let name = format!("{file}: {} {}", obj["kind"], obj["metadata"]["name"]);
            match create_strict(&client, &obj).await {
                // 400 for an unknown field under Strict, 422 for a schema violation.
                Err(kube::Error::Api(status)) => {
                    assert!([400, 422].contains(&status.code), "{name}: {status:?}")
                }
                other => panic!("{name} accepted: {other:?}"),
            }
        }
    }
}
