//! The demo's scripted stream of changes: every `interval` one step on the simulated cluster (or a
//! forged delivery to the appliance), looping until cancelled, each announced by one `demo …` line.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::pods::Pods;
use super::samples::{self, NODES, Pod, REQUESTED_IPS};
use super::say;
use crate::fake_apiserver::{FakeApiServer, Resource};

/// The Service the script creates, changes and deletes in every round.
const NAMESPACE: &str = "shop";
const NAME: &str = "checkout";
/// The rack (`127.0.<rack>.x`) of the scripted Service's Pod.
const CHECKOUT_RACK: u8 = 250;
/// The seeded Service whose labels change under a cut watch stream.
const CUT_TARGET: (&str, &str) = ("payments", "gateway");

/// One scripted step, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Create `shop/checkout` with port 80.
    Create,
    /// Add port 8443 to it.
    ChangePorts,
    /// Request a VIP for it by annotation.
    Annotate,
    /// Delete it.
    Delete,
    /// Replace the two Pods of `shop/web` (mode `pod`) the way a rolling update does.
    RollPods,
    /// Take Node `w3` out of load balancers (odd rounds) or back in (even rounds).
    ToggleNode,
    /// Expire every open watch (`410 Gone`).
    ForceGone,
    /// Cut the next watch event mid-line, then change a label of `payments/gateway`.
    CutMidLine,
    /// Send the appliance a delivery signed with the wrong secret.
    Forge,
}

impl Step {
    /// Every step, in script order.
    pub const ALL: [Step; 9] = [
        Step::Create,
        Step::ChangePorts,
        Step::Annotate,
        Step::Delete,
        Step::RollPods,
        Step::ToggleNode,
        Step::ForceGone,
        Step::CutMidLine,
        Step::Forge,
    ];

    /// The `demo` line announcing this step in round `round`.
    pub fn describe(self, round: u64) -> String {
        let svc = format!("{NAMESPACE}/{NAME}");
        let (ns, name) = CUT_TARGET;
        match self {
            Step::Create => format!("create Service {svc} (port 8080/TCP) and its Pod"),
            Step::ChangePorts => format!("change the ports of {svc}: 8080/TCP → 8080/TCP,8443/TCP"),
            Step::Annotate => format!("annotate {svc} with {REQUESTED_IPS}=127.0.100.30"),
            Step::Delete => format!("delete Service {svc}"),
            Step::RollPods => {
                "roll the Pods of shop/web (members in mode pod): 4 EndpointSlice writes, one MODIFIED".into()
            }
            Step::ToggleNode if round % 2 == 1 => {
                "label Node w3 node.kubernetes.io/exclude-from-external-load-balancers=true: nodePort members drop it"
                    .into()
            }
            Step::ToggleNode => "remove the exclusion label from Node w3: it is a member again".into(),
            Step::ForceGone => {
                "expire every watch (410 Gone): vipwatch re-lists; nothing changed, so nothing is recorded".into()
            }
            Step::CutMidLine => format!(
                "cut the watch stream in the middle of the next event (a label change on {ns}/{name}): vipwatch resumes and the change still arrives"
            ),
            Step::Forge => "send the appliance a delivery signed with the wrong secret".into(),
        }
    }

    /// Performs the step in round `round` (1-based; it makes each round's label value new).
    async fn apply(self, cluster: &FakeApiServer, forger: &Forger, pods: &Pods, round: u64) {
        match self {
            Step::Create => {
                let svc = samples::lb(NAMESPACE, NAME, &[("http", 8080)]);
                pods.ensure(samples::pod_ip(CHECKOUT_RACK, 1), &format!("{NAMESPACE}/{NAME}")).await;
                cluster.apply_resource(
                    Resource::EndpointSlices,
                    samples::pods(&svc, CHECKOUT_RACK, &[(1, "w3", Pod::Ready)]),
                );
                cluster.apply(svc);
            }
            Step::ChangePorts => {
                let mut updated = None;
                cluster.update(NAMESPACE, NAME, |svc| {
                    svc["spec"]["ports"] = json!([samples::port_json("http", 8080), samples::port_json("https", 8443)]);
                    updated = Some(svc.clone());
                });
                if let Some(svc) = updated {
                    cluster.apply_resource(
                        Resource::EndpointSlices,
                        samples::pods(&svc, CHECKOUT_RACK, &[(1, "w3", Pod::Ready)]),
                    );
                }
            }
            Step::Annotate => {
                cluster.update(NAMESPACE, NAME, |svc| {
                    svc["metadata"]["annotations"] = json!({ REQUESTED_IPS: "127.0.100.30" });
                });
            }
            Step::Delete => {
                cluster.delete(NAMESPACE, NAME);
            }
            Step::RollPods => roll_pods(cluster, pods, round).await,
            Step::ToggleNode => {
                let (name, ip, zone) = NODES[2];
                cluster.apply_resource(Resource::Nodes, samples::node(name, ip, zone, round % 2 == 1));
            }
            Step::ForceGone => cluster.faults().force_gone(),
            Step::CutMidLine => {
                cluster.faults().cut_next_event_mid_line();
                let (ns, name) = CUT_TARGET;
                cluster.update(ns, name, |svc| {
                    svc["metadata"]["labels"]["demo.vipwatch.io/round"] = json!(round.to_string())
                });
            }
            Step::Forge => forger.send().await,
        }
    }
}

/// Runs the script against `cluster` (forged deliveries go to `appliance_url`; new Pods are started in
/// `pods`), one step every `interval`, until `cancel` fires.
pub async fn run(
    cluster: FakeApiServer,
    appliance_url: String,
    pods: Arc<Pods>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let forger = Forger::new(appliance_url);
    for round in 1.. {
        for step in Step::ALL {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            say(&format!("demo       {}", step.describe(round)));
            step.apply(&cluster, &forger, &pods, round).await;
        }
    }
}

/// A rolling update of `shop/web`'s two Pods, as the EndpointSlice controller writes it: the new Pods
/// (`10.244.<round+1>.1-2`) start, become ready, the old ones drain, then go. Written back to back,
/// within one coalescing window: vipwatch sends one MODIFIED with the final members.
async fn roll_pods(cluster: &FakeApiServer, pods: &Pods, round: u64) {
    let Some(web) = cluster.get("shop", "web") else { return };
    let (old, new) = (u8::try_from(round % 200).unwrap_or(1), u8::try_from(round % 200 + 1).unwrap_or(2));
    for host in [1, 2] {
        pods.ensure(samples::pod_ip(new, host), "shop/web").await;
    }
    let pods = |state: Pod| vec![(1, "w1", state), (2, "w2", state)];
    let steps = [
        [pods(Pod::Ready), pods(Pod::Starting)],
        [pods(Pod::Ready), pods(Pod::Ready)],
        [pods(Pod::Draining), pods(Pod::Ready)],
        [Vec::new(), pods(Pod::Ready)],
    ];
    for [old_pods, new_pods] in steps {
        let mut slice = samples::pods(&web, new, &new_pods);
        let old_slice = samples::pods(&web, old, &old_pods);
        let endpoints = slice["endpoints"].as_array_mut().expect("endpoints");
        endpoints.extend(old_slice["endpoints"].as_array().cloned().unwrap_or_default());
        cluster.apply_resource(Resource::EndpointSlices, slice);
    }
}

/// Sends deliveries signed with a key the appliance does not know.
struct Forger {
    url: String,
    client: reqwest::Client,
    signer: standardwebhooks::Webhook,
}

impl Forger {
    fn new(url: String) -> Self {
        let signer = standardwebhooks::Webhook::from_bytes(rand::random::<[u8; 32]>().to_vec()).expect("any key signs");
        Self { url, client: reqwest::Client::new(), signer }
    }

    /// One forged `service.deleted` for `shop/web`; the answer is the appliance's to print.
    async fn send(&self) {
        let body = json!({"type": "service.deleted", "timestamp": "1970-01-01T00:00:00.000Z",
            "data": {"event_id": null, "event": "DELETED", "cause": "watch", "previous": null, "changed": [],
                     "service": {"namespace": "shop", "name": "web", "vips": ["127.0.100.10"], "ports": []}}})
        .to_string();
        let (id, ts) = ("msg_forged", jiff::Timestamp::now().as_second());
        let signature = self.signer.sign(id, ts, body.as_bytes()).expect("JSON is UTF-8");
        let request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .body(body);
        if let Err(e) = request.send().await {
            tracing::warn!(error = %e, "cannot send the forged delivery");
        }
    }
}
